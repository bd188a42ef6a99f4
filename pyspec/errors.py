"""The one error hierarchy: every error a user can cause or fix is a PyspecError with a stable `code`.

The command line prints such an error as one `error:` line and exits with status 2; the browser
worker sends `{"error": {"code", "message"}}` and the page's client throws a `SpecError` with the
same code. Both read `code` from the exception, so a new error class needs no list updated
anywhere. The codes:

  bad_model           a corrupt, truncated or unsupported GGUF, or a tokenizer it cannot give
  incompatible_draft  a draft that no exact bridge can serve (compat.py: an unreadable tokenizer,
                      a head unlike its tokenizer, no token shared with the champion)
  prompt_too_long     the prompt (or the sequence) does not fit the context
  bad_config          an unknown or malformed option, draft spec, K policy or message list
  bad_workload        a workload (a benchmark's, the gate's, the page's sample) that is not JSONL
                      prompts, or holds none (apps/workload.py)
  bad_input           inputs to a rule that no rule can use (verify.py's checks)
  gpu_error           a WebGPU validation, out-of-memory or readback failure
  gpu_timeout         a GPU readback that did not finish within the watchdog
  gpu_unrecoverable   the GPU failed more often in one request than the engine recovers from
  no_webgpu           no WebGPU adapter
  device_lost         the GPU device was lost
  not_ready           the browser session has no model loaded yet
  out_of_memory       a host allocation failed (a context or a model too large for this memory)
  worker_oom          the browser worker ran out of memory mid-request (client.js restarts it)
  model_too_large     the model card says no engine of this device can hold the model (the
                      page refuses it before the download; apps/info.py's memory rule)

Anything else that escapes is a bug, code `internal`. Each class keeps a builtin base
(ValueError, RuntimeError) as well, so callers that catch those still do.
"""

from __future__ import annotations

from contextlib import contextmanager


class PyspecError(Exception):
    """Base of every error pyspec raises on purpose. The message says what to do. `option`:
    the request option (options.py REQUEST) the error is about, where it is about one, so that a
    front end names it in its own words (the command line: the flag as typed)."""

    code = "internal"
    option: str | None = None


@contextmanager
def about(option: str):
    """A PyspecError raised inside is about request option `option` (unless it names another)."""
    try:
        yield
    except PyspecError as e:
        if e.option is None:
            e.option = option
        raise


# One wording, whatever the command, for a path that names no file (models, messages, schemas,
# receipts, workloads): "PATH: no such file; check the path".
NO_SUCH_FILE = "no such file; check the path"


def path_problem(path, e: OSError) -> str:
    """`PATH: what is wrong.` for a file that cannot be opened (e from open())."""
    if isinstance(e, FileNotFoundError):
        return f"{path}: {NO_SUCH_FILE}."
    if isinstance(e, IsADirectoryError):
        return f"{path}: is a folder, not a file; name the file."
    return f"{path}: cannot read the file ({e.strerror or e}); check that it is a file you may read."


def error_code(e: BaseException) -> str:
    """The protocol code of an exception: its own for a PyspecError, else `internal`."""
    return e.code if isinstance(e, PyspecError) else "internal"


class UsageError(PyspecError, ValueError):
    """A bad command-line value or input file (a workload, a messages file)."""

    code = "bad_config"


class OutOfMemoryError(PyspecError, MemoryError):
    """A host allocation failed; the message says what was being allocated and how to shrink it."""

    code = "out_of_memory"


class ModelTooLargeError(PyspecError, MemoryError):
    """No engine here can hold the model by the model card's memory rule (apps/info.py)."""

    code = "model_too_large"


class OptionsError(PyspecError, ValueError):
    """An invalid generation option."""

    code = "bad_config"


class ContextOverflowError(PyspecError, ValueError):
    """The sequence would grow past the cache's context length."""

    code = "prompt_too_long"


class PromptTooLongError(ContextOverflowError):
    """The prompt leaves no room in the context to generate."""


class TreeUnsupportedError(OptionsError):
    """A --tree request this engine cannot verify exactly (a backend without the tree pass, a
    drafter that drafts no trees, sampling controls or a schema); refused before it runs."""
