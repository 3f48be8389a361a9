import numpy as np

from asr_server.inference.level import MAX_GAIN_DB, TARGET_DBFS, raised, talker_gain_db


def test_a_quiet_talker_is_raised_to_the_target_and_a_loud_one_is_left_as_it_is():
    assert talker_gain_db(TARGET_DBFS - 25.0) == 25.0
    assert talker_gain_db(TARGET_DBFS + 6.0) == 0.0  # never lowered: recordings at the usual level are untouched
    assert talker_gain_db(None) == 0.0  # no level yet: as it came
    assert talker_gain_db(-120.0) == MAX_GAIN_DB


def test_raising_is_one_gain_for_all_the_audio():
    audio = (np.sin(np.arange(16000) / 5.0) * 0.001).astype(np.float32)
    assert raised(audio, 0.0) is audio
    louder = raised(audio, 20.0)
    assert louder.dtype == np.float32 and np.allclose(louder, audio * 10.0, rtol=1e-5)
