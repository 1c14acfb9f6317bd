"""What vulture may not see used (`tests/test_layout.py::test_no_dead_code`): names that a framework, a
library object or a user calls, never the package itself. Add a name here only with its reason."""

# ruff: noqa: B018, F821
# Python, Hydra and DDP call these: a module __getattr__, a callback's hooks, a signal handler's
# arguments, context-manager arguments, hook keyword arguments, DDP's gradient-sync switch.
__getattr__
SweepSummary
_.on_job_end
_.on_multirun_end
job_return
kwargs
frame
signum
exc
_.require_backward_grad_sync
_.id  # hydra.job.id, set as Hydra's launcher sets it
# pickle.Unpickler's hooks, which it calls for each global and storage (checkpoint_header.py).
_.find_class
_.persistent_load
# Settings of objects of other libraries: CTranslate2's model spec, a `tokenizers` Tokenizer, what a
# fused torch optimizer's step reads (as GradScaler sets it), the app uvicorn answers past its
# connection limit with (jobs/serve.py).
_.service_unavailable
_.found_inf
_.grad_scale
_.gamma
_.beta
_.scale_embeddings
_.bos_token
_.eos_token
_.unk_token
_.decoder_start_token
_.add_source_bos
_.add_source_eos
_.layer_norm_epsilon
_.pre_tokenizer
_.post_processor  # the exported tokenizer.json ends each source with <eos> (interop/hf.py)
_.normalizer
_.encode_special_tokens
# `data.load_pairs`: a corpus's pairs in memory, for notebooks and small corpora.
load_pairs
# The public API's own calls, for users: `Translator.predict(text)` (the tutorials' one-sentence call)
# and `Vocabulary.decode_src`, the pair of `decode_tgt`.
_.predict
_.decode_src
# serve/app.py: pydantic reads `model_config` and the response models' fields; FastAPI calls the route
# and exception-handler functions it registers by decorator.
_.model_config
_.source_tokens
_.target_tokens
_.translations
_.alignments
_.withheld
http_error
invalid
health
# jobs/serve.py: uvicorn.Server calls its capture_signals, which the serve job overrides; asyncio calls
# the protocol's data_received, and uvicorn's protocol reads its timeout_keep_alive_task.
_.capture_signals
_.data_received
_.timeout_keep_alive_task
# model/reference.py: nn.TransformerEncoder's settings (read by torch), and `from_model`, which the tests
# call to load our weights into the reference.
_.enable_nested_tensor
_.use_nested_tensor
_.from_model
# html.parser.HTMLParser's callbacks, which it calls for each tag, text and comment (documents/html_pages.py).
_.handle_starttag
_.handle_startendtag
_.handle_endtag
_.handle_data
_.handle_comment
_.handle_decl
_.handle_pi
_.unknown_decl
attrs
decl
# Issue 62's target terms: what the translator calls once glossaries are wired to it (a term's token
# variants, the terms a sentence's positions can hold); tests/test_glossary.py uses them until then.
term_variants
fit_terms
