"""The WER the benches and end-to-end tests report: what it forgives and what it still counts."""

from tests.wer import errors, wer


def test_contractions_count_as_the_words_they_stand_for():
    assert errors("You are through to voicemail, we can not take your call", "You're through to voicemail, we can't take your call.") == (0, 11)
    assert errors("I will be there", "I'll be there") == (0, 4)
    # A possessive is not a contraction: "John's" stays one word, and "it is" against "it's" is still two errors.
    assert errors("John's call", "John's call") == (0, 2)
    assert errors("it is late", "it's late") == (2, 3)


def test_the_spacing_of_a_compound_is_not_a_word_error():
    assert errors("press pound to leave a voice mail", "Press pound to leave a voicemail.") == (0, 7)
    assert errors("using your touch-tone keypad", "Using your touchtone key pad") == (0, 5)
    # Short parts are words of their own: "a way" against "away" is a real difference.
    assert errors("there is a way out", "there is away out") == (2, 5)


def test_wrong_words_still_count():
    assert errors("the caller will hold", "the color will hold") == (1, 4)
    # Digits said one by one are not the number the digits make.
    assert errors("seven four two nine", "7429") == (3, 4)
    assert wer("ill disposed young man", "old sposed young man") == 0.5


def test_numbers_written_as_digits_are_the_words_said():
    assert errors("the keeper climbed one hundred and twelve steps", "The keeper climbed 112 steps.") == (0, 7)
    assert errors("closed two hundred tickets", "closed 200 tickets") == (0, 4)
    assert errors("opened it with two thousand dollars", "opened it with $2,000.") == (0, 6)
    assert errors("three thousand eight hundred miles", "3,800 miles") == (0, 5)
    # A wrong number is still wrong, word by word.
    assert errors("one hundred and twelve steps", "120 steps") == (1, 4)
