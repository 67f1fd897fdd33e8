"""The engine core: requests, scheduling, the KV cache, the model runner and output processing.

Modules here import torch lazily or not at all, so the scheduler and the KV-cache
manager can be tested (and replaced) without a model.
"""
