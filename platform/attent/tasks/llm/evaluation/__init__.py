"""Downstream evaluation of fine-tuned LLMs: answer checking, sandboxed code execution,
batched greedy generation, the evaluation suites (GSM8K, MATH, CHAMP, HumanEval, MBPP, MT-Bench)."""
