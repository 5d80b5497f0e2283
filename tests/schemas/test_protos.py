from schemas import generate_protos


def test_committed_generated_code_is_fresh():
    assert generate_protos.stale_modules() == [], "run `make protos` and commit the result"
