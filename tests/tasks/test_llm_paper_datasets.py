"""The LLM training sets under the names the paper's appendix gives them: WizardLM/evol_instruct_196k
is ``wizardlm_evol_instruct_196k`` (WizardLM's Evol-Instruct V2), read from a copy laid out like
its hub repository, or from a merged file in the mirror folder."""

import json

from attent.tasks.llm.data import load_examples
from attent.tasks.llm.sources import SOURCES

from tests.tasks.test_llm_hub_loaders import WIZARDLM_V2, hub_repo, named, private_datasets_cache  # noqa: F401


def test_the_papers_dialogue_set_reads_evol_instruct_v2(tmp_path):
    source = SOURCES["wizardlm_evol_instruct_196k"]
    assert source.hub_path == "WizardLMTeam/WizardLM_evol_instruct_V2_196k"
    repo = hub_repo(tmp_path / "WizardLM_evol_instruct_V2_196k", {"WizardLM_evol_instruct_V2_143k.json": WIZARDLM_V2})
    examples = named("wizardlm_evol_instruct_196k", repo)
    assert [e.conversation() for e in examples] == [  # every exchange of a conversation
        ["Name a prime above 10.", "11 is a prime above 10."],
        ["Say hi.", "Hi!", "Again.", "Hi again!"],
    ]


def test_a_merged_196k_file_in_the_mirror_folder_is_read_instead(tmp_path):
    folder = tmp_path / "mirror"
    (folder / "wizardlm_evol_instruct_196k").mkdir(parents=True)
    rows = [
        {"idx": "sharegpt_1", "conversations": [{"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."}]}
    ]
    (folder / "wizardlm_evol_instruct_196k" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples = load_examples(
        "wizardlm_evol_instruct_196k", folder=folder, prompt_field="", response_field="", limit=None
    )
    assert [(e.prompt, e.response) for e in examples] == [("Hi?", "Hello.")]
