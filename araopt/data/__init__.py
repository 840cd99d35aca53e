"""Data sets: the paper's synthetic conversion logs (Sec. 5.3) and their fit, the Criteo loader and the
time split."""
