"""vLLM's speculative-decoding counters as /metrics serves them (names and labels of vLLM 0.32's
``v1/spec_decode/metrics.py``), for tests that judge acceptance from two scrapes."""

SPEC_COUNTERS = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {draft_tokens}
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="2"}} {p2}
"""


def spec_counters(drafts: float, draft_tokens: float, accepted: float, p0: float, p1: float, p2: float) -> str:
    """One scrape's counters: drafts, drafted tokens, accepted tokens, accepted at positions 0-2."""
    return SPEC_COUNTERS.format(drafts=drafts, draft_tokens=draft_tokens, accepted=accepted, p0=p0, p1=p1, p2=p2)
