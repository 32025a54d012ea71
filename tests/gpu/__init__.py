"""Tests that run on a real NVIDIA GPU host (pytest marker `gpu`); skipped on machines without one."""
