"""The agents stage against a live vLLM server on the tiny model, with three faults in one server
(a start costs ~1 min on 2 cores): a served --chat-template one character off the declared one, a
tool parser that does not read the template's call syntax, and a schema the server cannot honour.
Each fails its own check, naming the conversation, the parser or the schema; the checks the
faults do not touch still measure, the reasoning parser's among them (the same server runs
deepseek_r1 on the tiny template's think tags). The default deployment's own run is make demo's."""

import pytest

from day0.config.profile import load_profile
from day0.engine import ServerEngine, local_model_dir
from day0.model.tiny import CHAT_TEMPLATE
from day0.stages.agents import Agents, corpus

pytestmark = pytest.mark.engine  # starts vLLM: one such test at a time under xdist (tests/conftest.py)

# A $ref to nothing: the grammar compiler cannot build it, so vLLM answers 400 to that request.
UNHONOURABLE = {"type": "object", "properties": {"x": {"$ref": "#/$defs/nowhere"}}, "required": ["x"]}


@pytest.fixture
def faulty(tmp_path):
    declared, served = tmp_path / "declared.jinja", tmp_path / "served.jinja"
    declared.write_text(CHAT_TEMPLATE)
    served.write_text(CHAT_TEMPLATE.replace("<tool_response>", "<tool_responce>"))
    profile = load_profile("cpu-tiny", overrides={
        "engine": {"start_early": False, "args": {
            "chat_template": str(served), "tool_call_parser": "pythonic", "reasoning_parser": "deepseek_r1",
            "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True,
                                          "enable_in_reasoning": True}}},
        "agents": {"chat_template": str(declared), "structured_requests": 5, "tool_requests": 4,
                   "stream_pairs": 1, "none_requests": 2, "auto_requests": 0}})
    engine = ServerEngine(profile, tmp_path, print, name="agents-faults")
    engine.start()
    yield profile, engine
    engine.stop()


def test_each_fault_fails_its_own_check_by_name(faulty, monkeypatch):
    profile, engine = faulty
    monkeypatch.setitem(corpus.SCHEMAS, "unhonourable", UNHONOURABLE)
    stage = Agents(engine.endpoint, profile, profile.agents, local_model_dir(profile), print)

    template = stage.chat_template()
    assert template.status == "fail" and template.value == 4, template.message
    assert "tool_result: token" in template.message and "declared.jinja" in template.message

    parser = stage.tool_parser()
    assert parser.status == "fail" and "tool_call_parser=pythonic does not read" in parser.message

    structured = {c.id: c for c in stage.structured()}["agents.structured_outputs"]
    assert structured.status == "fail" and "http_error" in structured.evidence["findings"], structured.message
    refused = [f for f in structured.evidence["failures"] if "http_error" in f]
    assert refused and all(f.startswith("schema unhonourable #4") for f in refused), refused

    none = stage.tool_choice_none()
    assert none.status == "pass", none.message  # the fault-free checks still measure

    thought = stage.reasoning()
    assert thought.status == "pass", thought.message
    assert thought.evidence["cut_inside_reasoning"] == 2 and thought.evidence["closed_reasoning"] >= 1
