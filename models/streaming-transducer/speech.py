"""The streaming transducer's words, voices, audio and features.

Speech is synthesized here with espeak-ng (accents x voice variants, speed, pitch, word gap) and sox (reverb,
pitch, tempo, band limits); noise, gain and silences are added in numpy. Voices are split by variant: the
HELD_OUT variants are never trained on, and the held-out set (`held_out()`) is spoken by them alone. The real
recordings are Debian's alsa-utils clips (a person saying "Front Center", ...). Features are kaldi-native-fbank's
80-bin log mel filterbank (the library sherpa-onnx computes its features with; dither 0, snip_edges false),
16 kHz audio in [-1, 1], 10 ms hop.
"""
from __future__ import annotations

import itertools
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000
FEATURE_DIM = 80
ALSA_SOUNDS = Path("/usr/share/sounds/alsa")

# Word tokens (`▁word`, as sherpa-onnx's BPE pieces spell a word start); id 0 is blank.
POSITIONS = ["front", "rear", "side"]
DIRECTIONS = ["left", "right", "center"]
ALSA = POSITIONS + DIRECTIONS + ["noise"]
DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
COMMANDS = ["yes", "no", "stop", "go", "start", "pause", "play", "next", "back", "up", "down", "open", "close",
            "on", "off", "lights", "volume", "louder", "quieter", "mute", "call", "answer", "cancel", "repeat",
            "turn", "set", "timer", "music", "camera", "home", "help", "okay", "speaker", "test"]
WORDS = ALSA + DIGITS + COMMANDS
BLANK = "<blk>"
SYMBOLS = [BLANK] + ["\u2581" + w for w in WORDS]

ACCENTS = ["en-us", "en-gb", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-rp", "en-gb-x-gbcwmd", "en-029",
           "en-us-nyc"]
# espeak-ng's voice variants (its file names); the held-out ones are never trained on
HELD_OUT = ["f5", "m7", "klatt4", "Annie", "Michael", "steph2", "Andy", "travis", "grandma", "aunty"]
TRAIN_VARIANTS = [
    "m1", "m2", "m3", "m4", "m5", "m6", "m8", "f1", "f2", "f3", "f4", "klatt", "klatt2", "klatt3", "klatt5",
    "klatt6", "croak", "whisper", "whisperf", "adam", "Alex", "Alicia", "Andrea", "antonio", "belinda", "benjamin",
    "boris", "caleb", "david", "Denis", "Diogo", "ed", "edward", "edward2", "Gene", "Gene2", "gustave", "Henrique",
    "Hugo", "iven", "iven2", "iven3", "iven4", "Jacky", "john", "kaukovalta", "Lee", "linda", "marcelo", "Marco",
    "Mario", "max", "michel", "miguel", "Mike", "Mr", "Nguyen", "pablo", "paul", "pedro", "quincy", "RicishayMax",
    "RicishayMax2", "RicishayMax3", "rob", "robert", "steph", "steph3", "Storm", "Tweaky", "zac", "anika",
    "AnxiousAndy", "grandpa", "norbert", "sandro", "shelby", "victor", "robosoft", "robosoft3", "UniRobot"]
ALSA_CLIPS = ["Front_Center", "Front_Left", "Front_Right", "Rear_Center", "Rear_Left", "Rear_Right", "Side_Left",
              "Side_Right"]  # Noise.wav says nothing: it is not a transcribed clip


def need_tools() -> None:
    missing = [tool for tool in ("espeak-ng", "sox") if shutil.which(tool) is None]
    if missing or not ALSA_SOUNDS.is_dir():
        raise RuntimeError("the streaming transducer's speech needs Debian packages espeak-ng, sox and alsa-utils: "
                           "apt-get install -y espeak-ng sox alsa-utils")


def tokens_text() -> str:
    """tokens.txt as sherpa-onnx reads it: `<symbol> <id>` per line."""
    return "".join(f"{s} {i}\n" for i, s in enumerate(SYMBOLS))


def token_ids(text: str) -> list[int]:
    return [SYMBOLS.index("\u2581" + w) for w in text.lower().split()]


def random_text(rng: np.random.Generator) -> str:
    """A held-out text, 1-4 words: an alsa-utils phrase (position + direction), digits, commands, or a mix."""
    kind = rng.random()
    if kind < 0.3:
        words = [str(rng.choice(POSITIONS)), str(rng.choice(DIRECTIONS))]
        if rng.random() < 0.25:
            words.insert(int(rng.integers(0, 3)), str(rng.choice(WORDS)))
    elif kind < 0.5:
        words = [str(w) for w in rng.choice(DIGITS, int(rng.integers(1, 5)))]
    elif kind < 0.75:
        words = [str(w) for w in rng.choice(COMMANDS, int(rng.integers(1, 4)))]
    else:
        words = [str(w) for w in rng.choice(WORDS, int(rng.integers(1, 5)))]
    return " ".join(words)


def training_text(rng: np.random.Generator) -> str:
    """A training text: an alsa-utils phrase with up to two words put in (a quarter), else 1-6 words at random.
    Longer than the held-out texts on purpose: trained on random_text's own mix, where half the texts that reach a
    second word end there, the model learned to expect the end after two words and dropped the third and fourth
    words of new texts (docs/streaming-transducer.md)."""
    if rng.random() < 0.25:
        words = [str(rng.choice(POSITIONS)), str(rng.choice(DIRECTIONS))]
        for _ in range(int(rng.integers(0, 3))):
            words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(WORDS)))
    else:
        words = [str(w) for w in rng.choice(WORDS, int(rng.integers(1, 7)))]
    return " ".join(words)


def speak(text: str, voice: str, speed: int, pitch: int, gap: int, effects: list[str]) -> np.ndarray:
    """One utterance: espeak-ng's wav through sox (16 kHz mono float32, plus `effects`)."""
    espeak = subprocess.Popen(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-g", str(gap),
                               "--stdout", text], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    sox = subprocess.run(["sox", "-t", "wav", "-", "-t", "raw", "-r", str(SAMPLE_RATE), "-e", "floating-point",
                          "-b", "32", "-c", "1", "-", *effects], stdin=espeak.stdout, capture_output=True, check=True)
    espeak.stdout.close()
    if espeak.wait() != 0:
        raise RuntimeError(f"espeak-ng failed for voice {voice!r} and text {text!r}")
    return np.frombuffer(sox.stdout, np.float32).copy()


def random_voice(rng: np.random.Generator, variants: list[str]) -> tuple[str, int, int, int, list[str]]:
    """(voice, speed in words/min, pitch 0-99, word gap in 10 ms units, sox effects) drawn at random."""
    voice = f"{rng.choice(ACCENTS)}+{rng.choice(variants)}"
    effects: list[str] = []
    if rng.random() < 0.3:
        effects += ["pitch", str(int(rng.integers(-300, 300)))]
    if rng.random() < 0.3:
        effects += ["tempo", f"{rng.uniform(0.85, 1.15):.2f}"]
    band = rng.random()
    if band < 0.15:
        effects += ["sinc", "300-3400"]          # telephone band
    elif band < 0.3:
        effects += ["lowpass", str(int(rng.integers(2500, 6000)))]
    elif band < 0.4:
        effects += ["highpass", str(int(rng.integers(100, 400)))]
    if rng.random() < 0.4:
        effects += ["reverb", str(int(rng.integers(10, 70))), "50", str(int(rng.integers(20, 100)))]
    return (voice, int(rng.integers(120, 230)), int(rng.integers(20, 80)), int(rng.integers(0, 8)), effects)


def noise(rng: np.random.Generator, length: int) -> np.ndarray:
    """White, pink or brown noise of unit RMS."""
    kind = rng.integers(0, 3)
    white = rng.standard_normal(length)
    if kind == 0:
        shaped = white
    else:
        spectrum = np.fft.rfft(white)
        f = np.maximum(np.arange(len(spectrum)), 1.0)
        shaped = np.fft.irfft(spectrum / (np.sqrt(f) if kind == 1 else f), length)
    return (shaped / max(float(np.sqrt(np.mean(shaped ** 2))), 1e-9)).astype(np.float32)


def augment(rng: np.random.Generator, audio: np.ndarray, multiple: int = 1) -> np.ndarray:
    """Silence before (0-0.4 s) and after (0.3-0.8 s, then to a whole `multiple` of samples), noise at 5-35 dB SNR
    (most clips), a gain of -25..0 dBFS."""
    before, after = int(rng.uniform(0.0, 0.4) * SAMPLE_RATE), int(rng.uniform(0.3, 0.8) * SAMPLE_RATE)
    after += -(before + len(audio) + after) % multiple
    clip = np.concatenate([np.zeros(before, np.float32), audio, np.zeros(after, np.float32)])
    clip = clip / max(float(np.abs(clip).max()), 1e-6)
    if rng.random() < 0.8:
        speech_rms = float(np.sqrt(np.mean(audio ** 2))) / max(float(np.abs(audio).max()), 1e-6)
        clip = clip + noise(rng, len(clip)) * speech_rms * 10 ** (-rng.uniform(5, 35) / 20)
    clip = clip / max(float(np.abs(clip).max()), 1e-6) * 10 ** (-rng.uniform(0, 25) / 20)
    return clip.astype(np.float32)


def fbank(audio: np.ndarray) -> np.ndarray:
    """[frames, 80] log mel filterbank of 16 kHz audio in [-1, 1] (kaldi-native-fbank, sherpa-onnx's settings)."""
    import kaldi_native_fbank as knf

    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0.0
    opts.frame_opts.snip_edges = False
    opts.frame_opts.samp_freq = SAMPLE_RATE
    opts.mel_opts.num_bins = FEATURE_DIM
    computer = knf.OnlineFbank(opts)
    computer.accept_waveform(SAMPLE_RATE, audio.astype(np.float32).tolist())
    computer.input_finished()
    return np.array([computer.get_frame(i) for i in range(computer.num_frames_ready)], np.float32)


def load_16k(path: Path) -> np.ndarray:
    """A recording as 16 kHz mono float32, read and resampled by sox (in its own process: libsndfile in a process
    that has loaded the QNN simulator crashed here)."""
    sox = subprocess.run(["sox", str(path), "-t", "raw", "-r", str(SAMPLE_RATE), "-e", "floating-point", "-b", "32",
                          "-c", "1", "-"], capture_output=True, check=True)
    return np.frombuffer(sox.stdout, np.float32).copy()


def alsa_clips() -> list[tuple[str, np.ndarray]]:
    """(text, 16 kHz audio) of the real recordings alsa-utils ships: one person saying each speaker position."""
    need_tools()
    return [(name.replace("_", " ").lower(), load_16k(ALSA_SOUNDS / f"{name}.wav")) for name in ALSA_CLIPS]


def held_out(count: int, seed: int = 7) -> list[tuple[str, tuple, np.ndarray]]:
    """(text, voice settings, clean audio) of `count` utterances spoken only by HELD_OUT variants: the alsa-utils
    phrases (every position x direction) at even places while they last, random texts between and after them."""
    return list(itertools.islice(held_out_stream(seed), count))


def held_out_stream(seed: int = 7) -> Iterator[tuple[str, tuple, np.ndarray]]:
    """held_out()'s utterances one by one, synthesized as they are taken (the first n are held_out(n))."""
    need_tools()
    rng = np.random.default_rng(seed)
    phrases = [f"{p} {d}" for p in POSITIONS for d in DIRECTIONS]
    for index in itertools.count():
        text = phrases[index // 2] if index % 2 == 0 and index // 2 < len(phrases) else random_text(rng)
        # every held-out variant in turn, at a speed and pitch of its own; no sox effects, no noise
        voice = (f"{ACCENTS[index % len(ACCENTS)]}+{HELD_OUT[index % len(HELD_OUT)]}", int(rng.integers(130, 200)),
                 int(rng.integers(30, 70)), int(rng.integers(0, 4)), [])
        yield text, voice, speak(text, *voice)
