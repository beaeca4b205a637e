"""LLM LoRA instruction fine-tuning (MetaMathQA, CodeFeedback, WizardLM, GSM8K, MBPP).

Import what you need from the submodules: ``attent.tasks.llm.config.LLMTaskConfig`` and
``attent.tasks.llm.task.LLMTask``. This file stays empty so ``attent.evaluation`` can use the
data and prompt helpers without importing the task (and thereby itself).
"""
