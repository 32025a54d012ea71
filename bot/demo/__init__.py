"""The demo: a fake multi-process inference server, a replaying fake nvidia-smi, and `gpubot demo`."""
