"""InferenceSession.run_async: a run on a thread of its own, reported to a callback there
(onnxruntime's signature: ``callback(results, user_data, error_text)``)."""

from __future__ import annotations

import threading
from typing import Any

from ortagent.errors import OrtInvalidType


def start(session: Any, output_names: Any, input_feed: Any, callback: Any, user_data: Any,
          run_options: Any) -> None:
    """Run `session` on a new thread, then call `callback` there: the results as run() returns
    them and error_text '' on success; None and the error's text on failure."""
    if not callable(callback):
        raise OrtInvalidType(f"callback must be callable, got {type(callback).__name__}")
    feeds = dict(input_feed) if isinstance(input_feed, dict) else input_feed   # the caller may change theirs

    def work() -> None:
        try:
            results = session.run(output_names, feeds, run_options)
        except Exception as exc:
            callback(None, user_data, str(exc))
        else:
            callback(results, user_data, "")

    threading.Thread(target=work, name="ortagent-run-async", daemon=True).start()
