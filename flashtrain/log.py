"""The one logger of flashtrain: messages go through `logging.getLogger("flashtrain")` and only
rank 0 prints them, so a multi-process run reads like a single-process one."""

from __future__ import annotations

import logging
import os

_configured = False


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def get_logger() -> logging.Logger:
    global _configured
    logger = logging.getLogger("flashtrain")
    if not _configured:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s flashtrain] %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO if rank() == 0 else logging.WARNING)
        logger.propagate = False
        _configured = True
    return logger
