"""The read side of the Table contract (tests/test_contract.py) over tables on S3.

Remote tables are read-only, so the contract tests of writes are not collected here;
``test_read_only`` checks the refusal.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_contract import (  # noqa: E402,F401
    KEYS, E, test_bad_ids_raise, test_context_manager, test_every_integer_dtype, test_geometry,
    test_lookup_any_shape, test_lookup_python_int_and_list, test_non_integer_ids_raise,
    test_out_buffer, test_out_buffer_checked, test_read_only, test_scalar_result_is_a_copy,
    test_keys, test_keys_absent, test_slices, test_threads_read_concurrently, test_unknown_keys)
