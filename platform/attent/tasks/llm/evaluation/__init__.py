"""Downstream evaluation of fine-tuned LLMs: answer checking, sandboxed code execution,
batched greedy generation, benchmark runners (GSM8K, MATH, CHAMP, HumanEval, MBPP, MT-Bench)."""
