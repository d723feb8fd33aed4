"""Stage 1b - parity: every feature the deployment turns on keeps the greedy output right. Each
comparison isolates one feature against the same engine over HTTP (or, for speculation, against
transformers), near-ties allowed; a feature not in force is a skip that says so."""

import pytest

from day0.engine import local_model_dir
from day0.stages import parity

pytestmark = [pytest.mark.day0, pytest.mark.parity]


@pytest.fixture
def stage(day0_context):
    """The stage's settings and the features in force; fresh prompts for every comparison."""
    ctx = day0_context
    return parity.Parity(ctx.endpoint, ctx.profile, ctx.section, ctx.progress)


def test_prefix_caching(stage, day0_checks):
    """The same prompt as a cold miss and as a full hit: the cached KV gives the same tokens."""
    day0_checks.extend(parity.check_feature(stage, "prefix_caching"))


def test_streaming(stage, day0_checks):
    """The same request streamed and not streamed: same tokens, logprobs and finish reason."""
    day0_checks.extend(parity.check_feature(stage, "streaming"))


def test_batch_invariance(stage, day0_checks):
    """A request alone and inside a concurrent batch of others: same tokens and logprobs."""
    day0_checks.extend(parity.check_feature(stage, "batch_invariance"))


def test_speculative_decoding(stage, day0_context, day0_checks):
    """Greedy tokens under speculation equal transformers' (it is lossless); acceptance rate and
    mean acceptance length from /metrics within their limits."""
    day0_checks.extend(parity.check_feature(stage, "speculative", local_model_dir(day0_context.profile)))


def test_chunked_prefill(stage, day0_context, day0_checks):
    """A prompt a quarter past the chunk budget (two engine steps or more of prefill) gives
    transformers' greedy tokens and logprobs on the same text."""
    day0_checks.extend(parity.check_feature(stage, "chunked_prefill", local_model_dir(day0_context.profile)))


def test_long_context(stage, day0_context, day0_checks):
    """Greedy tokens after a prompt 3/4 as long as max_model_len equal transformers': deep positions
    are where rope scaling and paging bugs show, and short prompts never reach them."""
    day0_checks.extend(parity.check_feature(stage, "long_context", local_model_dir(day0_context.profile)))


def test_graph_mode_and_parallel_layout(stage, day0_context, day0_checks):
    """No request-level comparison isolates them: the deployment as configured against transformers
    (weights.golden_tokens) answers for them, carried over with its status."""
    golden = day0_context.record.latest(parity.GOLDEN)
    day0_checks.extend([parity.through_golden(stage.features[n], golden) for n in parity.THROUGH_GOLDEN])


def test_features_in_force(stage, day0_context, day0_checks):
    """Every feature the engine args turn on, where the setting came from, what it was compared
    against, and the ones not compared yet with the reason."""
    day0_checks.extend([parity.feature_matrix(stage.features, day0_context.record.checks(stage="parity"))])
