"""LLM LoRA instruction fine-tuning (MetaMathQA, CodeFeedback, WizardLM, GSM8K, MBPP), with its
downstream evaluation (``attent.tasks.llm.evaluation``: GSM8K, MATH, CHAMP, HumanEval, MBPP,
MT-Bench).

A self-contained package: nothing here imports outside ``attent.tasks.llm``, the task
interface (``attent.tasks.task``, ``attent.tasks.config``) and the run contract. Import what you need from the submodules:
``attent.tasks.llm.config.LLMTaskConfig`` (light: pydantic only) and
``attent.tasks.llm.task.LLMTask``. This file stays empty so the light config imports nothing heavy.
"""
