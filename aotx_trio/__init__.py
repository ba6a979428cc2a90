"""aotx-trio: an LLM serving runtime for persistent shared conversations.

Subpackages and modules (imports point downward only; ``tests/test_layers.py``
checks it):

    cli  serve                command line (``aotx``) and the embedded ``aotx serve``
    runtime/  gateway/        the two process roles; neither imports the other
    router/                   the serving router's registry store (folder, PostgreSQL)
                              and ``aotx registry``
    _process  client  grants  shared by both roles: process plumbing, the device
                              client (both transports), the deployment grant file
    config  wire              gateway.json; service-socket framing
    device  journal  engine   Python faces of the native library
    embed  tokenizer  models
    native                    loads the cffi extension, translates its codes
    errors  vocab  _fs        leaves: the error tree, the contract's vocabulary
"""

__version__ = "0.1.0"
