"""A real trained model (../shared/models/aidreams260K.gguf, when present) behind the API: its
id is the file name without .gguf, and the greedy continuation through the server is llama.cpp's
reference text (tests/tools: the same prompt with FP32 weights and KV)."""


import pytest

from conftest import ROOT, Server

MODEL = ROOT.parent / "shared/models/aidreams260K.gguf"


@pytest.mark.skipif(not MODEL.exists(), reason=f"{MODEL} is not here")
def test_gguf_model_served(tmp_path):
    s = Server(tmp_path, model=str(MODEL),
               extra=["--prefill-weights", "fp32", "--decode-weights", "fp32",
                      "--kv-cache-dtype", "fp32", "--kv-cache-bytes", "4M"])
    try:
        c = s.client("acme")
        assert [m.id for m in c.models.list().data] == ["aidreams260K"]
        r = c.completions.create(model="aidreams260K", prompt="Once upon a time", max_tokens=40,
                                 temperature=0)
        text = "Once upon a time" + r.choices[0].text
        assert text.startswith("Once upon a time, pixels unfolding like petals. Classifications "
                               "unfold, a kaleidoscope of prob"), text
    finally:
        assert s.stop() == 0
