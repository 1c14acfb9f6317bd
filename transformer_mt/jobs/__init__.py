"""The jobs behind the command line, one module each: each takes its command's typed config.

train.py      `transformer-mt train`: the Trainer, from config to checkpoints
evaluate.py   `transformer-mt evaluate`: scores and speed of a checkpoint on held-out text
translate.py  `transformer-mt translate`: text from the command line, stdin, a file or a prompt
export.py     `transformer-mt export`: a checkpoint as a CTranslate2 model directory

Jobs import building blocks, never each other.
"""
