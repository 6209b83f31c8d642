"""A callback for the resume tests: the training process SIGKILLs itself (no clean-up, no final
checkpoint) when it reaches global step $KILL_AT_STEP; without that variable it does nothing."""

import os
import signal

import lightning as L


class KillAtStep(L.Callback):
    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_step == int(os.environ.get("KILL_AT_STEP", -1)):
            os.kill(os.getpid(), signal.SIGKILL)
