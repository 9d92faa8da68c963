"""`samples:` from media declared in model.yaml: images, WAV clips, raw bytes (qnn_tasks/modelspec/specsamples.py, judge/media.py).

Unit tests read real files written here (PNG/JPEG by Pillow, WAV by the stdlib `wave`, WAV/FLAC/OGG by sox, raw
bytes by numpy) through the spec loader and the one sample loader; spec errors are one line naming the key and the
fix; memory peaks are measured with tracemalloc.
"""
from __future__ import annotations

import shutil
import wave
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from qnn_tasks.errors import SpecError, StageError
from qnn_tasks.judge import bounds, media
from qnn_tasks.judge.sample_store import read_declared
from qnn_tasks.modelspec.load import load_model, load_socs

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "tests" / "examples"
SOCS = load_socs(EXAMPLES / "socs" / "socs.yaml")
ALSA = Path("/usr/share/sounds/alsa/Front_Center.wav")


def model_folder(tmp_path: Path, inputs: str, samples: str, outputs: str = "y: {shape: [1, 4]}") -> Path:
    folder = tmp_path / "m"
    folder.mkdir(exist_ok=True)
    (folder / "model.onnx").write_bytes(b"")  # the spec loader only names it
    (folder / "model.yaml").write_text(f"""\
licence: test
source: {{file: model.onnx}}
graphs:
  g:
    inputs: {{{inputs}}}
    outputs: {{{outputs}}}
    samples: {samples}
""")
    return folder


def graph(folder: Path):
    return load_model(folder, SOCS).graphs[0]


def write_png(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def write_wav(path: Path, values: np.ndarray, rate: int, channels: int = 1, width: int = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    scaled = np.clip(np.round(values * 32767), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(width)
        wav.setframerate(rate)
        wav.writeframes(scaled.tobytes())


# ================================================================ images

def gradient(height: int, width: int) -> np.ndarray:
    """An RGB image whose R rises along x, G along y, B constant 200."""
    rows, cols = np.mgrid[0:height, 0:width]
    return np.stack([cols * 255 // max(width - 1, 1), rows * 255 // max(height - 1, 1),
                     np.full_like(rows, 200)], axis=-1).astype(np.uint8)


def test_image_stretch_nchw_rgb_scale_mean_std(tmp_path):
    folder = model_folder(tmp_path, "x: {shape: [1, 3, 8, 8], dtype: float32}",
                          '{image: {files: "images/*.png", mean: [0.5, 0.5, 0.5], std: [0.25, 0.5, 1.0]}}')
    write_png(folder / "images/a.png", gradient(8, 8))
    write_png(folder / "images/b.png", np.zeros((16, 16, 3), np.uint8))  # stretched down to 8x8
    samples = read_declared(graph(folder))
    assert len(samples) == 2 and samples[0]["x"].shape == (1, 3, 8, 8) and samples[0]["x"].dtype == np.float32
    x = samples[0]["x"][0]
    expected = (gradient(8, 8).astype(np.float32) / 255 - 0.5) / np.array([0.25, 0.5, 1.0], np.float32)
    np.testing.assert_allclose(x, np.moveaxis(expected, -1, 0), rtol=1e-6)
    np.testing.assert_allclose(samples[1]["x"][0, 2], (0 - 0.5) / 1.0)


def test_image_letterbox_bgr_nhwc_keeps_aspect_and_pads(tmp_path):
    folder = model_folder(tmp_path, "x: {shape: [1, 8, 8, 3], dtype: uint8}",
                          '{image: {files: "images", resize: letterbox, layout: NHWC, channels: BGR, pad_value: 114}}')
    red = np.zeros((4, 8, 3), np.uint8)
    red[..., 0] = 255  # a wide red image: 8x4 -> 8x4 in the middle rows of 8x8
    write_png(folder / "images/wide.png", red)
    (folder / "images/notes.txt").write_text("not an image")  # a folder stands for its image files
    [sample] = read_declared(graph(folder))
    x = sample["x"][0]
    assert x.dtype == np.uint8 and x.shape == (8, 8, 3)
    assert (x[:2] == 114).all() and (x[6:] == 114).all()                  # padding above and below
    assert (x[2:6, :, 2] == 255).all() and (x[2:6, :, :2] == 0).all()     # red lands in channel 2 (BGR)


def test_image_fit_height_keeps_aspect_and_pads_right_in_model_units(tmp_path):
    """Issue 35: an OCR recogniser is fed a line brought to its height, aspect kept, padded on the right with 0 after
    normalisation; neither the resize nor a pad value in model units could be declared."""
    folder = model_folder(tmp_path, "x: {shape: [1, 3, 8, 32], dtype: float32}",
                          '{image: {files: "lines/*.png", resize: fit-height, pad_normalised: 0.0, mean: 0.5, std: 0.5}}')
    line = gradient(16, 40)                                  # 40x16 -> 20x8, then 12 columns of padding
    write_png(folder / "lines/a.png", line)
    write_png(folder / "lines/b.png", gradient(8, 100))      # wider than the input: squeezed to 32x8, no padding
    first, second = (s["x"][0] for s in read_declared(graph(folder)))
    resized = np.asarray(Image.fromarray(line).resize((20, 8), Image.BILINEAR), np.float32)
    np.testing.assert_allclose(first[:, :, :20], np.moveaxis((resized / 255 - 0.5) / 0.5, -1, 0), atol=1e-6)
    assert (first[:, :, 20:] == 0.0).all()                   # padded in model units, right of the line only
    squeezed = np.asarray(Image.fromarray(gradient(8, 100)).resize((32, 8), Image.BILINEAR), np.float32)
    np.testing.assert_allclose(second, np.moveaxis((squeezed / 255 - 0.5) / 0.5, -1, 0), atol=1e-6)


def test_image_letterbox_pad_in_pixels_or_model_units(tmp_path):
    """pad_value is a pixel (0 -> -1.0 after mean 0.5, std 0.5); pad_normalised is the input's own value."""
    write_png(tmp_path / "m/images/wide.png", gradient(4, 8))  # 8x4 in the middle rows of 8x8
    values = {}
    for pad in ("pad_value: 0", "pad_normalised: 0.25"):
        folder = model_folder(tmp_path, "x: {shape: [1, 3, 8, 8], dtype: float32}",
                              f'{{image: {{files: images, resize: letterbox, {pad}, mean: 0.5, std: 0.5}}}}')
        [sample] = read_declared(graph(folder))
        values[pad] = sample["x"][0]
    assert (values["pad_value: 0"][:, :2] == -1.0).all() and (values["pad_normalised: 0.25"][:, 6:] == 0.25).all()
    np.testing.assert_array_equal(values["pad_value: 0"][:, 2:6], values["pad_normalised: 0.25"][:, 2:6])


@pytest.mark.parametrize("inputs, image, problem, fix", [
    ("x: {shape: [1, 3, 8, 8], dtype: float32}", "resize: fit-height, pad_value: 0, pad_normalised: 0.0",
     "samples.image.pad_normalised: both pad_value (pixels) and pad_normalised (model units) are given", "keep one"),
    ("x: {shape: [1, 3, 8, 8], dtype: uint8}", "resize: fit-height, pad_normalised: 0.0",
     "samples.image.pad_normalised: input 'x' is uint8: pixels are fed as they are", "pad_value"),
    ("x: {shape: [1, 3, 8, 8], dtype: float32}", "resize: fit-height, pad_normalised: 1.0e300",
     "samples.image.pad_normalised: 1e+300 is beyond the largest float32", "e.g. pad_normalised: 0.0"),
    ("x: {shape: [1, 3, 8, 8], dtype: float16}", "resize: fit-height, pad_normalised: 70000.0",
     "samples.image.pad_normalised: 70000.0 is beyond the largest float16 (+-65504)", "holds"),
])
def test_image_pad_normalised_spec_errors(tmp_path, inputs, image, problem, fix):
    folder = model_folder(tmp_path, inputs, f'{{image: {{files: "*.png", {image}}}}}')
    write_png(folder / "a.png", gradient(8, 8))
    with pytest.raises(SpecError) as info:
        graph(folder)
    line = str(info.value)
    assert problem in line and fix in line.split("(fix: ", 1)[1] and "\n" not in line, line


def test_image_grey_jpeg_and_exact_size(tmp_path):
    folder = model_folder(tmp_path, "x: {shape: [1, 1, 6, 10], dtype: float32}",
                          '{image: {files: "*.jpg", channels: grey, resize: none, scale: 1.0}}')
    Image.fromarray(np.full((6, 10, 3), 128, np.uint8)).save(folder / "grey.jpg", quality=95)
    [sample] = read_declared(graph(folder))
    assert sample["x"].shape == (1, 1, 6, 10) and abs(float(sample["x"].mean()) - 128) < 2
    Image.fromarray(np.zeros((7, 10, 3), np.uint8)).save(folder / "other.jpg")
    with pytest.raises(StageError, match=r"other.jpg: is 10x7, the input wants 10x6 \(fix: resize: stretch"):
        read_declared(graph(folder))


def test_image_feeds_one_input_and_fill_the_other(tmp_path):
    folder = model_folder(tmp_path, "x: {shape: [1, 3, 4, 4], dtype: float32}, state: {shape: [1, 2], dtype: float32}",
                          '{image: {files: "*.png", input: x}, fill: {state: 0.5}}')
    for name in ("a", "b", "c"):
        write_png(folder / f"{name}.png", gradient(4, 4))
    samples = read_declared(graph(folder))
    assert len(samples) == 3 and all((s["state"] == 0.5).all() and s["state"].shape == (1, 2) for s in samples)


def test_a_damaged_image_is_one_line(tmp_path):
    folder = model_folder(tmp_path, "x: {shape: [1, 3, 4, 4], dtype: float32}", '{image: {files: "*.png"}}')
    (folder / "bad.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(StageError) as info:
        read_declared(graph(folder))
    assert "graphs.g.samples.image: bad.png: cannot be read as image" in str(info.value)
    assert "(fix: replace or remove the file)" in str(info.value) and "\n" not in str(info.value)


def test_a_symlink_out_of_the_model_folder_is_refused(tmp_path):
    folder = model_folder(tmp_path, "x: {shape: [1, 3, 4, 4], dtype: float32}", '{image: {files: "*.png"}}')
    write_png(tmp_path / "outside.png", gradient(4, 4))
    (folder / "in.png").symlink_to(tmp_path / "outside.png")
    with pytest.raises(SpecError, match="leads through a symlink to .*outside the model folder"):
        graph(folder)  # refused at load; the stage checks again when it reads (a link added later)


# ================================================================ audio

def test_audio_resampled_framed_with_hop_and_padded(tmp_path):
    folder = model_folder(tmp_path, "x: {shape: [1, 400], dtype: float32}",
                          '{audio: {files: "clips/*.wav", rate: 16000, hop: 160}}')
    t = np.arange(48000 // 10) / 48000  # 0.1 s at 48 kHz -> 1600 samples at 16 kHz
    write_wav(folder / "clips/tone.wav", 0.5 * np.sin(2 * np.pi * 440 * t), 48000)
    samples = read_declared(graph(folder))
    # 1600 samples, frames of 400 every 160: (1600 - 400) / 160 = 7.5 -> padded to 9 frames
    assert len(samples) == 9 and samples[0]["x"].shape == (1, 400)
    tone = 0.5 * np.sin(2 * np.pi * 440 * np.arange(1600) / 16000)
    np.testing.assert_allclose(samples[1]["x"][0, 50:350], tone[160 + 50:160 + 350], atol=2e-3)
    assert (samples[-1]["x"][0, -40:] == 0).all()  # the zero padding of the last window


def test_audio_int16_scale_gains_and_stacked_frames(tmp_path):
    folder = model_folder(tmp_path, "x: {shape: [1, 2, 100], dtype: float32}",
                          '{audio: {files: "a.wav", frame: 100, int16_scale: true, gain: [1.0, 0.01], pad: false}}')
    write_wav(folder / "a.wav", np.full(450, 0.25), 16000)
    samples = read_declared(graph(folder))
    # 450 samples -> 4 whole frames (the partial one dropped) -> 2 samples of 2 frames, for each gain
    assert len(samples) == 4 and samples[0]["x"].shape == (1, 2, 100)
    np.testing.assert_allclose(samples[0]["x"], 8192, atol=1)   # 0.25 at int16 scale
    np.testing.assert_allclose(samples[2]["x"], 82, atol=1)     # the quiet copy


def test_audio_int16_input_and_real_alsa_clip(tmp_path):
    if not ALSA.is_file():
        pytest.skip("alsa-utils sounds not installed")
    folder = model_folder(tmp_path, "x: {shape: [1, 16000], dtype: int16}", '{audio: {files: "*.wav", rate: 16000}}')
    shutil.copy(ALSA, folder / "front.wav")  # 48 kHz mono speech, 1.4 s
    samples = read_declared(graph(folder))
    assert len(samples) == 2 and samples[0]["x"].dtype == np.int16  # int16 input: int16 scale by default
    assert 3000 < np.abs(samples[0]["x"]).max() < 32768


def test_resample_keeps_passband_and_removes_what_aliases():
    t = np.arange(48000) / 48000
    def rms(frequency: float) -> float:
        return float(np.sqrt(np.mean(media.resample(np.sin(2 * np.pi * frequency * t), 48000, 16000)[200:-200] ** 2)))
    assert abs(rms(1000) - 0.7071) < 1e-3 and rms(10000) < 1e-3  # 10 kHz would alias to 6 kHz
    up = media.resample(np.sin(2 * np.pi * 440 * np.arange(16000) / 16000), 16000, 44100)
    assert len(up) == 44100
    np.testing.assert_allclose(up[300:-300], np.sin(2 * np.pi * 440 * np.arange(44100) / 44100)[300:-300], atol=1e-3)


def test_a_file_that_is_no_audio_is_named_with_the_fix(tmp_path):
    folder = model_folder(tmp_path, "x: {shape: [1, 100], dtype: float32}", '{audio: {files: "*.wav"}}')
    (folder / "f.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEjunk" + bytes(40))
    with pytest.raises(StageError, match=r"f.wav: not an audio file libsndfile reads: .*\(fix: convert it"):
        read_declared(graph(folder))


# ================================================================ raw bytes

def test_raw_bytes_with_header_cut_into_samples(tmp_path):
    folder = model_folder(tmp_path, "ids: {shape: [1, 3], dtype: int32}", '{raw: {files: "*.bin", dtype: int64, offset: 4}}')
    (folder / "ids.bin").write_bytes(b"HDR!" + np.arange(6, dtype="<i8").tobytes())
    samples = read_declared(graph(folder))
    assert [s["ids"].tolist() for s in samples] == [[[0, 1, 2]], [[3, 4, 5]]]
    assert samples[0]["ids"].dtype == np.int32
    (folder / "ids.bin").write_bytes(b"HDR!" + np.arange(5, dtype="<i8").tobytes())
    with pytest.raises(StageError, match=r"40 bytes after offset 4 are not a whole number of int64 \[1, 3\]"):
        read_declared(graph(folder))


def test_sources_with_different_counts_are_refused(tmp_path):
    folder = model_folder(tmp_path, "x: {shape: [1, 3, 4, 4], dtype: float32}, ids: {shape: [1, 2], dtype: int32}",
                          '{image: {files: "*.png", input: x}, raw: {files: "*.bin", input: ids}}')
    write_png(folder / "a.png", gradient(4, 4))
    (folder / "ids.bin").write_bytes(np.arange(4, dtype="<i4").tobytes())
    with pytest.raises(StageError, match=r"the sources give different numbers of samples \{'x': 1, 'ids': 2\}"):
        read_declared(graph(folder))
    samples_yaml = '{image: {files: "*.png", input: x}, raw: {files: "*.bin", input: ids, limit: 1}}'
    folder = model_folder(tmp_path, "x: {shape: [1, 3, 4, 4], dtype: float32}, ids: {shape: [1, 2], dtype: int32}",
                          samples_yaml)
    assert [s["ids"].tolist() for s in read_declared(graph(folder))] == [[[0, 1]]]


# ================================================================ spec errors: one line, at load

SPEC_CASES = [
    ('{image: {files: "*.png", size: 3}}', "graphs.g.samples.image.size: unknown key", "use one of: channels"),
    ('{image: {files: "*.png", layout: CHW}}', "graphs.g.samples.image.layout: unknown value 'CHW'", "NCHW, NHWC"),
    ('{image: {files: "*.png", channels: grey}}', "samples.image.channels: grey has 1 channel(s), input 'x' [1, 3, 8, 8]",
     "set channels"),
    ('{image: {files: "*.png", mean: [0.5, 0.5]}}', "samples.image.mean: 2 values for 3 channel(s)", "give one number, or 3"),
    ('{image: {files: "*.png", std: 0}}', "samples.image.std: [0, 0, 0] has a value <= 0", "give positive numbers"),
    ('{image: {files: "*.jpg"}}', "samples.image.files: '*.jpg' matches no image file", "fix the pattern"),
    ('{image: {files: "../*.png"}}', "samples.image.files: '../*.png' leaves the model folder", "without '..'"),
    ('{image: {files: "*.png", input: y}}', "samples.image.input: 'y' is not an input of the graph", "use one of: x"),
    ('{audio: {files: "*.png"}}', "samples.audio.files: '*.png' matches no audio file (.wav, .flac", "fix the pattern"),
    ('{}', "graphs.g.samples.files: required key is missing", 'samples: {image: {files: "images/*.png"}}'),
    ('{fill: {y: 0}}', "graphs.g.samples.fill.y: not an input of the graph", "use one of: x"),
    ('{fill: {}}', "graphs.g.samples: no source feeds input(s) ['x']", "fill: {x: 0.0}"),  # fill alone: every input
    ('{files: "*.npz", image: {files: "*.png"}}', "samples.image: files (.npz/.npy) already give every input",
     "not both"),
    ('{image: {files: "*.png"}, fill: {x: 1}}', "samples.image.input: the graph has inputs ['x']: which one",
     "add input:"),
    ('{images: {files: "*.png"}}', "graphs.g.samples.images: unknown key", "image:"),
    ('{fill: {x: 1.0e300}}', "graphs.g.samples.fill.x: 1e+300 is beyond the largest float32", "holds"),
]


@pytest.mark.parametrize("samples, problem, fix", SPEC_CASES, ids=[c[1].split(": ")[0] + "-" + str(i)
                                                                    for i, c in enumerate(SPEC_CASES)])
def test_spec_errors_name_the_key_and_the_fix(tmp_path, samples, problem, fix):
    folder = model_folder(tmp_path, "x: {shape: [1, 3, 8, 8], dtype: float32}", samples)
    write_png(folder / "a.png", gradient(8, 8))
    with pytest.raises(SpecError) as info:
        load_model(folder, SOCS)
    line = str(info.value)
    assert line.startswith(f"{folder / 'model.yaml'}: ") and problem in line and "(fix: " in line and fix in line, line
    assert "\n" not in line


def test_spec_audio_frame_must_divide_the_input(tmp_path):
    folder = model_folder(tmp_path, "x: {shape: [1, 576], dtype: float32}", '{audio: {files: "*.wav", frame: 500}}')
    write_wav(folder / "a.wav", np.zeros(1000), 16000)
    with pytest.raises(SpecError, match=r"samples.audio.frame: 500 samples do not divide input 'x' \[1, 576\]"):
        load_model(folder, SOCS)


def test_spec_uncovered_input_is_named(tmp_path):
    folder = model_folder(tmp_path, "x: {shape: [1, 100], dtype: float32}, state: {shape: [2], dtype: float32}",
                          '{audio: {files: "*.wav", input: x}}')
    write_wav(folder / "a.wav", np.zeros(1000), 16000)
    with pytest.raises(SpecError, match=r"graphs.g.samples: no source feeds input\(s\) \['state'\] "
                                        r"\(fix: add input: state to a source, or fill: \{state: 0.0\}\)"):
        load_model(folder, SOCS)


# The docs' model.yaml examples (media samples among them) are loaded by tests/test_docs.py.


def test_spec_loading_with_media_samples_imports_no_numpy_or_pillow(tmp_path):
    """Task generation reads YAML only: media sources are validated without numpy or Pillow."""
    import subprocess
    import sys

    folder = model_folder(tmp_path, "x: {shape: [1, 3, 8, 8], dtype: float32}, s: {shape: [1, 2], dtype: float32}",
                          '{image: {files: "*.png", input: x, resize: letterbox}, fill: {s: 0.0}}')
    write_png(folder / "a.png", gradient(8, 8))
    code = ("import sys; from pathlib import Path; from qnn_tasks.modelspec.load import load_model, load_socs; "
            f"g = load_model(Path({str(folder)!r}), load_socs(Path({str(ROOT / 'socs' / 'socs.yaml')!r}))).graphs[0]; "
            "assert g.samples['image']['resize'] == 'letterbox' and g.sample_files(), g.samples; "
            "heavy = [m for m in sys.modules if m.split('.')[0] in ('numpy', 'PIL', 'onnx', 'onnxruntime', 'wave')]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)


# ================================================================ hostile media: bounds in bytes, headers, what a viewer shows

def peak_bytes(function) -> tuple[object, int]:
    """(what `function()` returns, the peak of Python and numpy allocations while it ran), by tracemalloc."""
    import tracemalloc

    tracemalloc.start()
    try:
        result = function()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_limit_picks_images_before_any_is_decoded(tmp_path):
    """100 small PNGs for a 3 x 256 x 256 float input (768 KiB a sample): limit 3 decodes 3 of them, not 100."""
    folder = model_folder(tmp_path, "x: {shape: [1, 3, 256, 256], dtype: float32}",
                          '{image: {files: "images/*.png", limit: 3}}')
    for i in range(100):
        write_png(folder / f"images/{i:03d}.png", np.full((8, 8, 3), i, np.uint8))
    spec = graph(folder)
    samples, peak = peak_bytes(lambda: read_declared(spec))
    assert [int(s["x"][0, 0, 0, 0] * 255 + 0.5) for s in samples] == [0, 50, 99]  # spread over all 100
    assert peak < 12 << 20, f"peak {peak >> 20} MiB: the 100 images were decoded before limit chose 3"


def test_the_samples_bytes_are_bounded_before_any_file_is_decoded(tmp_path, monkeypatch):
    folder = model_folder(tmp_path, "x: {shape: [1, 3, 64, 64], dtype: float32}", '{image: {files: "*.png"}}')
    for i in range(9):
        write_png(folder / f"{i}.png", gradient(64, 64))
    (folder / "9.png").write_bytes(b"\x89PNG damaged")  # decoding anything would fail on this file first
    monkeypatch.setattr(bounds, "MAX_SAMPLE_BYTES", 256 << 10)
    with pytest.raises(StageError) as info:
        read_declared(graph(folder))
    line = str(info.value)
    assert "graphs.g.samples: 10 samples of 49152 bytes take 0.5 MiB, more than the bound of 0.2 MiB" in line, line
    assert "(fix: set limit: 5 or less on each source)" in line and "\n" not in line


def test_a_sparse_raw_file_is_read_only_where_limit_picks(tmp_path):
    """A 64 MiB sparse file of 16 384 samples with limit 4: four 4 KiB reads, not the whole file in memory."""
    folder = model_folder(tmp_path, "x: {shape: [1, 1024], dtype: float32}", '{raw: {files: "big.bin", limit: 4}}')
    with open(folder / "big.bin", "wb") as fh:
        fh.truncate(64 << 20)
        fh.seek((64 << 20) - 4096)
        fh.write(np.arange(1024, dtype="<f4").tobytes())  # the last sample, which limit's spread includes
    spec = graph(folder)
    samples, peak = peak_bytes(lambda: read_declared(spec))
    assert len(samples) == 4 and samples[-1]["x"][0, 5] == 5.0 and not samples[0]["x"].any()
    assert peak < 4 << 20, f"peak {peak >> 20} MiB for 16 KiB of samples"


def child_peak_mib(script: str) -> tuple[str, int]:
    """(what `script` printed, its process's peak resident memory in MiB): run in a fresh interpreter, so the peak
    is this script's alone. VmHWM of the child's own memory map, read by the child: not ru_maxrss, which Linux carries
    over exec from the parent (an xdist worker of 445 MB made a 35 MB child report 445)."""
    import subprocess
    import sys

    code = script + ("\nimport re; hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read())"
                     "\nprint('peak', int(hwm.group(1)) >> 10)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    out, peak = done.stdout.rsplit("peak ", 1)
    return out, int(peak)


def test_a_sparse_gib_of_tiny_raw_samples_is_picked_without_listing_every_sample(tmp_path):
    """1 GiB of 16-byte samples is 67 million samples; limit 4 reads four of them. Listing every index to pick four
    took 2.6 GB (the child's ru_maxrss); now the peak is the interpreter's own."""
    folder = model_folder(tmp_path, "x: {shape: [1, 4], dtype: float32}", '{raw: {files: "big.bin", limit: 4}}')
    with open(folder / "big.bin", "wb") as fh:
        fh.truncate(1 << 30)
        fh.seek((1 << 30) - 16)
        fh.write(np.arange(4, dtype="<f4").tobytes())  # the last sample, which limit's spread includes
    out, peak = child_peak_mib(f"""
from pathlib import Path
from qnn_tasks.judge.sample_store import read_declared
from qnn_tasks.modelspec.load import load_model, load_socs
socs = load_socs(Path("tests/examples/socs/socs.yaml"))
samples = read_declared(load_model(Path({str(folder)!r}), socs).graphs[0])
print(len(samples), samples[-1]["x"].tolist(), samples[0]["x"].tolist())
""")
    assert out.split() == ["4", "[[0.0,", "1.0,", "2.0,", "3.0]]", "[[0.0,", "0.0,", "0.0,", "0.0]]"], out
    assert peak < 300, f"peak {peak} MiB to read 64 bytes of samples"


def test_audio_windows_are_picked_before_they_are_made(tmp_path):
    """A 20 s clip cut every 20 samples gives 16 000 windows (25 MiB); limit 8 makes 8 of them."""
    folder = model_folder(tmp_path, "x: {shape: [1, 400], dtype: float32}",
                          '{audio: {files: "a.wav", hop: 20, limit: 8}}')
    t = np.arange(20 * 16000) / 16000
    write_wav(folder / "a.wav", 0.5 * np.sin(2 * np.pi * 300 * t), 16000)
    spec = graph(folder)
    samples, peak = peak_bytes(lambda: read_declared(spec))
    assert len(samples) == 8
    whole = np.round(0.5 * np.sin(2 * np.pi * 300 * t) * 32767) / 32768
    second = round(15980 / 7)  # limit spreads 8 picks over the 15 981 windows: the second is window 2283
    np.testing.assert_allclose(samples[1]["x"][0], whole[second * 20:second * 20 + 400], atol=1e-6)
    assert peak < 12 << 20, f"peak {peak >> 20} MiB: every window was made before limit chose 8"


def test_an_audio_header_that_cannot_be_true_is_refused_before_decoding(tmp_path):
    """244 bytes claiming 2.1 GHz: refused from the header (resampling it drove memory to 6.8 GB)."""
    folder = model_folder(tmp_path, "x: {shape: [1, 400], dtype: float32}", '{audio: {files: "a.wav", rate: 16000}}')
    with wave.open(str(folder / "a.wav"), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(2_100_000_000)
        wav.writeframes(bytes(200))
    assert (folder / "a.wav").stat().st_size == 244
    with pytest.raises(StageError) as info:
        read_declared(graph(folder))
    assert "a.wav: its header claims a rate of 2100000000 Hz, which no recording has" in str(info.value)
    assert "(fix: replace the file" in str(info.value)


@pytest.mark.parametrize("key, value, problem", [
    ("hop", "1000000000000", "samples.audio.hop: 1000000000000 is out of range"),
    ("frame", "100000000", "samples.audio.frame: 100000000 is out of range"),
    ("gain", "[" + ", ".join(["1.0"] * 17) + "]", "samples.audio.gain: 17 gains, more than 16"),
])
def test_audio_keys_that_multiply_memory_are_bounded_at_load(tmp_path, key, value, problem):
    folder = model_folder(tmp_path, "x: {shape: [1, 400], dtype: float32}",
                          f'{{audio: {{files: "a.wav", {key}: {value}}}}}')
    write_wav(folder / "a.wav", np.zeros(1000), 16000)
    with pytest.raises(SpecError) as info:
        load_model(folder, SOCS)
    assert problem in str(info.value) and "(fix: " in str(info.value), str(info.value)


needs_sox = pytest.mark.skipif(not shutil.which("sox"),
                               reason="sox makes the test clips (scripts/install.sh installs it)")


@needs_sox
@pytest.mark.parametrize("name, sox_options, atol", [
    ("stereo24.wav", ["-b", "24", "-c", "2"], 1e-4),          # WAVE_FORMAT_EXTENSIBLE (sox writes it for these)
    ("quad16.wav", ["-b", "16", "-c", "4"], 1e-4),            # WAVE_FORMAT_EXTENSIBLE, 4 channels
    ("float.wav", ["-e", "floating-point", "-b", "32"], 1e-4),
    ("clip.flac", ["-b", "16"], 1e-4),
    ("clip.ogg", [], 0.05),                                    # lossy
])
def test_sox_clips_of_every_promised_kind_are_read(tmp_path, name, sox_options, atol):
    import subprocess

    folder = model_folder(tmp_path, "x: {shape: [1, 1600], dtype: float32}", f'{{audio: {{files: "{name}"}}}}')
    for path, options in ((folder / name, sox_options), (tmp_path / "plain.wav", ["-b", "16", "-c", "1"])):
        subprocess.run(["sox", "-D", "-n", "-r", "16000", *options, str(path), "synth", "0.1", "sine", "440",
                        "vol", "0.5"], check=True)  # -D: no dither, so every copy holds the same tone
    with wave.open(str(tmp_path / "plain.wav")) as plain:  # the stdlib reads the plain 16-bit mono copy
        expected = np.frombuffer(plain.readframes(1600), "<i2") / 32768.0
    [sample] = read_declared(graph(folder))
    np.testing.assert_allclose(sample["x"][0], expected, atol=atol)


def test_a_16_bit_grey_png_keeps_its_levels_and_says_so(tmp_path):
    """64 grey levels spread over 16 bits: all 64 reach the input (8-bit conversion kept 2: 0 and 255)."""
    folder = model_folder(tmp_path, "x: {shape: [1, 3, 8, 8], dtype: float32}",
                          '{image: {files: "deep.png", resize: none, scale: 1.0}}')
    levels = (np.arange(64).reshape(8, 8) * 1040).astype(np.uint16)
    Image.fromarray(levels).save(folder / "deep.png")
    assert Image.open(folder / "deep.png").mode == "I;16"
    [sample] = read_declared(graph(folder))
    np.testing.assert_allclose(sample["x"][0, 0], levels / 257.0, rtol=1e-6)  # 65535 -> 255.0, every level kept
    assert (sample["x"][0, 1] == sample["x"][0, 0]).all() and len(np.unique(sample["x"])) == 64
    notes = {}
    media.load(graph(folder), notes)  # what cpucheck's record says of the samples it read
    assert notes["image"]["16_bit"] == ["deep.png"]


def test_exif_orientation_is_applied_as_a_viewer_does(tmp_path):
    """A camera's portrait photo: stored 8 wide x 4 high with EXIF orientation 6 (rotate 90 clockwise to view)."""
    folder = model_folder(tmp_path, "x: {shape: [1, 8, 4, 3], dtype: uint8}",
                          '{image: {files: "photo.png", resize: none, layout: NHWC}}')
    stored = np.zeros((4, 8, 3), np.uint8)
    stored[0, 0] = (255, 0, 0)   # the stored top-left pixel is red
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(stored).save(folder / "photo.png", exif=exif)
    [sample] = read_declared(graph(folder))
    shown = sample["x"][0]
    assert shown.shape == (8, 4, 3) and tuple(shown[0, 3]) == (255, 0, 0)  # viewed: it is at the top right
    notes = {}
    media.load(graph(folder), notes)
    assert notes["image"]["orientation_applied"] == ["photo.png"]


FROM_YAML = """\
licence: test
source: {file: model.onnx}
graphs:
  embed:
    inputs: {x: {shape: [1, 16], dtype: float32}}
    outputs: {y: {shape: [1, 1024]}, z: {shape: [1, 1024]}}
    samples: {raw: {files: "w.bin"}}
  classify:
    inputs: {x: {shape: [1, 64, 1024], dtype: float32}}
    outputs: {logits: {shape: [1, 5]}}
    samples: {from: embed.y}
pipeline:
  graphs: [embed, classify]
  feed: {classify.x: {from: embed.y, stack: {runs: 64, axis: 1, hop: 1}}}
  verify:
    samples: 1
    checks:
      - top1: {output: logits, min: 1.0}
"""


def test_samples_from_an_earlier_graph_are_bounded_before_they_are_stacked(tmp_path, monkeypatch):
    """2 000 runs of embed (8 MiB of y) stacked 64 at a time every run are 1 937 windows, 484 MiB: refused before
    one window is made (the whole stack was made, then refused), naming a fix `from:` accepts (it has no limit)."""
    from qnn_tasks.judge.inputs import upstream_columns
    from qnn_tasks.plan.targets import upstream_references

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"")
    (folder / "model.yaml").write_text(FROM_YAML)
    (folder / "w.bin").write_bytes(bytes(64))
    classify = load_model(folder, SOCS).graphs[1]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "build/m/embed/cpucheck").mkdir(parents=True)
    y = np.random.default_rng(0).standard_normal((2000, 1, 1024)).astype(np.float32)
    np.savez(tmp_path / "build/m/embed/cpucheck/reference.npz", y=y, z=y)  # z: read by nobody
    monkeypatch.setattr(bounds, "MAX_SAMPLE_BYTES", 16 << 20)
    refused = []

    def refusal() -> None:
        with pytest.raises(StageError) as info:
            upstream_columns(classify, upstream_references(classify))
        refused.append(str(info.value))

    _, peak = peak_bytes(refusal)
    line = refused[0]
    assert peak < 24 << 20, f"peak {peak >> 20} MiB: the windows were stacked before the bound refused them"
    assert "graphs.classify.samples.from: 'embed' gives 1937 samples of 262144 bytes (windows of 64 of its 2000 " \
           "runs, one every 1), 484.2 MiB, more than the bound of 16.0 MiB" in line and "\n" not in line, line
    assert "(fix: give 'embed' at most 127 samples (a limit: on the media its samples come from), or a larger hop " \
           "in pipeline.feed.classify.x.stack)" in line, line
    # the fix works: 127 runs give 64 windows, 16 MiB; only y is read, and the windows are glued as they are made
    np.savez(tmp_path / "build/m/embed/cpucheck/reference.npz", y=y[:127], z=y[:127])
    columns, peak = peak_bytes(lambda: upstream_columns(classify, upstream_references(classify)))
    assert len(columns["x"]) == 64 and columns["x"][0].shape == (1, 64, 1024)
    np.testing.assert_array_equal(columns["x"][63][0], y[63:127, 0])
    assert peak < 24 << 20, f"peak {peak >> 20} MiB for 16 MiB of windows"


def test_a_pad_min_that_drops_every_window_is_named_with_the_pad_min_that_keeps_one(tmp_path):
    """Two clips of 1 000 and 600 samples, a frame of 1 600, pad_min 1 200: no window is kept. The stage said only "no
    samples were produced"; now the line names pad_min and the largest value that keeps a sample."""
    folder = model_folder(tmp_path, "x: {shape: [1, 1600], dtype: float32}",
                          '{audio: {files: "*.wav", rate: 16000, pad_min: 1200}}')
    t = np.arange(1000) / 16000
    write_wav(folder / "a.wav", 0.5 * np.sin(2 * np.pi * 300 * t), 16000)
    write_wav(folder / "b.wav", 0.5 * np.sin(2 * np.pi * 300 * t[:600]), 16000)
    with pytest.raises(StageError) as info:
        read_declared(graph(folder))
    line = str(info.value)
    assert "graphs.g.samples.audio.pad_min: 1200 drops every window" in line and "\n" not in line, line
    assert "(fix: pad_min: 1000 or less keeps 1 sample(s), or give longer clips)" in line, line
    # the fix works: pad_min 1000 keeps a.wav's one window
    (folder / "model.yaml").write_text((folder / "model.yaml").read_text().replace("pad_min: 1200", "pad_min: 1000"))
    assert len(read_declared(graph(folder))) == 1
