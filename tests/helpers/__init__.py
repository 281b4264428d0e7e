"""What the tests share that is not a fixture: paths, inputs built in code, and the helpers of
tests/helpers/*.py (imported as ``helpers.NAME``; tests/conftest.py puts tests/ on sys.path).
Fixtures live in the conftest.py of the tier that uses them (tests/conftest.py for all tiers)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
CASES = TESTS / "cases"  # inputs that broke pipelines like ours; cases/README.md gives each one's right result
TICKETS = (
    TESTS / "data" / "support_tickets.jsonl"
)  # a new user's corpus: 800 labelled short records {"id", "category", "text"}
