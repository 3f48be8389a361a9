from asr_server.decoding.stability import LocalAgreement


def test_words_two_hypotheses_agree_on_become_stable():
    la = LocalAgreement()
    assert la.update("the quick".split()) == ("the quick", 0)
    text, stable = la.update("the quick brown".split())
    assert text == "the quick brown" and text[:stable] == "the quick"
    text, stable = la.update("the quick brown fox".split())
    assert text[:stable] == "the quick brown"


def test_stable_prefix_never_changes_even_if_the_model_changes_its_mind():
    la = LocalAgreement()
    la.update("he was not".split())
    la.update("he was not an".split())
    text, stable = la.update("she was not an ill disposed".split())
    assert text.startswith("he was not")
    assert stable >= len("he was not")


def test_punctuation_differences_still_agree():
    la = LocalAgreement()
    la.update("Hello, world.".split())
    text, stable = la.update("Hello world how".split())
    assert text[:stable] == "Hello world"


def test_stable_is_monotonic_over_a_sequence():
    hyps = ["and", "and mr", "and mr john", "and mr john dash", "and mr john dashwood had", "and mr john dashwood had then"]
    la, last = LocalAgreement(), 0
    texts = []
    for h in hyps:
        text, stable = la.update(h.split())
        assert stable >= last
        for prev_text, prev_stable in texts:
            assert text[:prev_stable] == prev_text[:prev_stable]
        texts.append((text, stable))
        last = stable
