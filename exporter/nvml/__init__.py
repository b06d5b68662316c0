"""NVML behind a small backend interface: the real pynvml backend and a fake that replays captures."""
