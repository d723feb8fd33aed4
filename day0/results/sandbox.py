"""The sandbox a report's templates render in: Jinja2's, which keeps a site template from reaching
Python, plus bounds on what one expression may build. Jinja2's own sandbox lets ``"x" * 400000000``
build 400 MB and ``"%999999999d" % 1`` ask for a gigabyte; a report page is about a megabyte."""

from __future__ import annotations

import re
from typing import Any

from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment

MAX_BUILT = 1 << 24  # characters or items one operator may produce
MAX_POWER_BITS = 1 << 20  # an integer power's size: 10 ** 10 ** 8 would hold the renderer for minutes
_WIDTH = re.compile(r"%[-#0 +]*(\d+)?(?:\.(\d+))?")


class BoundedSandbox(SandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "%"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            seq, times = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(times, int) and len(seq) * times > MAX_BUILT:
                raise SecurityError(f"a repetition of {len(seq) * times} items, past {MAX_BUILT}")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int):
            if right > 0 and right * max(1, abs(left).bit_length()) > MAX_POWER_BITS:
                raise SecurityError(f"a power of {right * abs(left).bit_length()} bits, past {MAX_POWER_BITS}")
        elif operator == "%" and isinstance(left, str):
            widths = [int(w) for m in _WIDTH.finditer(left) for w in m.groups() if w]
            if any(w > MAX_BUILT for w in widths):
                raise SecurityError(f"a format width of {max(widths)}, past {MAX_BUILT}")
        return super().call_binop(context, operator, left, right)
