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


def test_a_year_in_digits_is_the_year_the_reference_says():
    assert errors("painted in fifteen ninety", "Painted in 1590.") == (0, 4)
    assert errors("born in nineteen oh five", "born in 1905") == (0, 5)
    assert errors("built in nineteen hundred", "built in 1900") == (0, 4)
    assert errors("until twenty twenty four", "until 2024") == (0, 4)
    # Said as a number where the reference says it so, and a wrong year is still wrong.
    assert errors("one thousand five hundred years", "1500 years") == (0, 5)
    assert errors("painted in fifteen ninety", "painted in 1950")[0] > 0


def test_ordinals_in_digits_are_the_words_said():
    assert errors("from the sixteenth and seventeenth centuries", "From the 16th and 17th centuries.") == (0, 6)
    assert errors("the twenty first of may", "the 21st of May") == (0, 5)
    assert errors("the first second third and twelfth", "the 1st 2nd 3rd and 12th") == (0, 6)
    assert errors("the twentieth time", "the 20th time") == (0, 3)
    assert errors("the sixteenth century", "the 17th century") == (1, 3)


def test_british_and_american_spelling_are_the_same_word():
    assert errors("fixed bikes for the neighbours", "fixed bikes for the neighbors") == (0, 5)
    assert errors("a harbour at sunset in the city centre", "a harbor at sunset in the city center") == (0, 8)
    assert errors("they realised the organisation travelled", "They realized the organization traveled.") == (0, 5)
    assert errors("the catalogue and the defence licence in grey", "the catalog and the defense license in gray") == (0, 8)
    assert errors("my favourite colours", "my favorite colors") == (0, 3)
    # Short words are left alone: a homophone is still another word.
    assert errors("four hours", "for hours") == (1, 2)
    assert errors("the filled forms", "the filed forms") == (1, 3)
