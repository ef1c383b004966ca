"""Replay of the openb GPU-sharing trace (FGD, USENIX ATC'23) through the real planner; pure, no file I/O."""
