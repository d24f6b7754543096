"""Serving a GPT over HTTP with tensor-parallel ranks and continuous batching.

``python -m neural_arch.serve --checkpoint DIR --tp 2 [--pp 2] [--port P]`` starts ``--tp`` times ``--pp``
ranks through the launcher; rank 0 answers HTTP, every rank holds its slice of the model and of each
request's KV cache (its heads under tensor parallelism, its stage's blocks under pipeline parallelism).

============================  ========================================================================
module                        what
============================  ========================================================================
``__main__``                  the command line: checks the checkpoint, launches the ranks
``worker``                    what each rank runs: rank 0 serves and steps the batch, the others follow
``server``                    the HTTP endpoint (``ThreadingHTTPServer``): /generate, /health, /config
``protocol``                  request validation (4xx with a sentence)
``batcher``                   continuous batching on rank 0 and the step plan it broadcasts
``decode_step``               one step on every rank: prefill joiners, decode the left-padded batch
``pipeline_stage``            ``--pp``: a rank's stage (its blocks) and the messages between stages
``checkpoint``                the serving checkpoint (config.json + model.safetensors), and a CLI to
                              write a randomly initialised one
============================  ========================================================================

Example::

    python -m neural_arch.serve.checkpoint ckpt --n-layer 2 --n-head 4 --n-embd 32
    python -m neural_arch.serve --checkpoint ckpt --tp 2 --port 8000
    curl -s localhost:8000/generate -H 'Content-Type: application/json' -d '{"prompt": [1, 2, 3], "max_new_tokens": 8}'
"""
