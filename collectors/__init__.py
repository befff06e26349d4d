"""Runtime instrumentation inside training processes (no analysis here).

`Recorder` writes this rank's records to a run directory (see docs/run-format.md);
`register_recording_hook` records DDP's gradient all-reduces.
"""

from collectors.ddp import register_recording_hook
from collectors.recorder import NullRecorder, Recorder

__all__ = ["NullRecorder", "Recorder", "register_recording_hook"]
