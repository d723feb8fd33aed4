"""The in-process view gets the engine's args and not the API server's: a profile that serves tool
calls (cpu-tiny) must still start ``vllm.LLM``, which refuses an argument it does not know."""

from day0.config.profile import load_profile
from day0.engine.inprocess import engine_kwargs


def test_the_api_servers_own_args_are_left_out_by_name():
    args = dict(load_profile("cpu-tiny").engine.args)
    kwargs, frontend = engine_kwargs({**args, "chat_template": "t.jinja", "api_key": "k"})
    assert frontend == ["api_key", "chat_template", "enable_auto_tool_choice", "tool_call_parser"]
    assert kwargs["structured_outputs_config"] == {"backend": "xgrammar", "disable_any_whitespace": True}
    assert kwargs["max_model_len"] == 8192 and "tool_call_parser" not in kwargs
