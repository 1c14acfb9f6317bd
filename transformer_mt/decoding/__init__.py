"""The decoding layer: search (greedy, beam, sampling), the translator that turns texts into texts,
forced-decoding scores and alignments, translation metrics, and the CTranslate2 engine and export."""
