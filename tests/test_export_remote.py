"""pelab-export with remote code: every encoding, a layout and stick-breaking attention load through transformers'
`trust_remote_code` in a process that cannot import pelab, Hydra or OmegaConf, and give PELab's logits; a trained
run's export is logged as a W&B artifact of that run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from helpers.runs import FAST, compose, offline_runs, wandb_records
from pelab.encodings import available_encodings
from pelab.model import build_model
from pelab.remote_code import rewrite, write_remote

transformers = pytest.importorskip("transformers")

V, L = 300, 32
# Beyond the encodings: a RoPE-local / NoPE-global layout, stick-breaking attention, scaled RoPE, a bias and no
# MLP (attention-only blocks), untied embeddings.
EXTRA = {"layout": ["pe=rope", "model.n_layers=4", "model.layout=[rope@window:8,nope]"],
         "stickbreaking": ["pe=nope", "model.attention=stickbreaking"],
         "yarn": ["pe=rope", "pe.scaling.type=yarn", "pe.scaling.factor=4"],
         "bias_attn_only_untied": ["pe=alibi", "model.bias=true", "model.d_ff=0", "model.tie_embeddings=false"]}
CASES = {**{name: [f"pe={name}"] for name in available_encodings()}, **EXTRA}

# Run in a fresh interpreter: pelab, hydra and omegaconf blocked, the checkout's src off the path; loads each
# export with AutoModelForCausalLM(trust_remote_code=True) and prints the largest |logit difference| per case.
LOADER = textwrap.dedent("""
    import json, sys
    for m in ("pelab", "hydra", "omegaconf"):
        sys.modules[m] = None  # an import of them fails
    import torch, transformers
    out = {}
    for folder in sys.argv[1:]:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
        ref = torch.load(folder + "/expected.pt")
        with torch.no_grad():
            out[folder] = (model(ref["x"]).logits - ref["logits"]).abs().max().item()
    print(json.dumps(out))
""")


def export_random_model(name: str, overrides: list[str], root: Path) -> Path:
    """A randomly initialised PELab GPT of FAST + overrides exported with remote code, with PELab's logits on a
    sequence of 3 x the training length (1 x for learned positions, whose table ends there) beside it."""
    cfg = compose([*FAST, *overrides])
    cfg = {g: OmegaConf.to_container(cfg[g], resolve=True) for g in ("pe", "model", "data")}
    torch.manual_seed(0)
    model = build_model(OmegaConf.create(cfg["model"]), OmegaConf.create(cfg["pe"]), V, L).eval()
    with torch.no_grad():  # learned parameters away from their init (FIRE, T5, KERPLE, FoX, biases ...)
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    out = write_remote(root / f"export_{name}", cfg, model.state_dict(), V, eot_id=256)
    x = torch.randint(0, V, (2, L if name == "learned" else 3 * L))
    with torch.no_grad():
        torch.save({"x": x, "logits": model(x)}, out / "expected.pt")
    return out


@pytest.mark.slow
def test_every_model_loads_without_pelab_and_gives_its_logits(tmp_path):
    folders = [export_random_model(name, overrides, tmp_path) for name, overrides in CASES.items()]
    env = {"PATH": "/usr/bin:/bin", "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", LOADER, *map(str, folders)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
                         stdin=subprocess.DEVNULL, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    diffs = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(diffs) == len(CASES)
    for folder, diff in diffs.items():
        assert diff <= 1e-5, f"{Path(folder).name}: logits differ by {diff}"


def test_the_copied_code_imports_only_torch_transformers_and_the_standard_library(tmp_path):
    """transformers' own import check (`check_imports`) passes on every file of an export that copies the most
    code (a layout: two encodings), and no file names pelab, hydra or omegaconf."""
    from transformers.dynamic_module_utils import get_imports

    folder = export_random_model("layout", EXTRA["layout"], tmp_path)
    stdlib = set(sys.stdlib_module_names)
    for path in folder.glob("*.py"):
        foreign = set(get_imports(path)) - stdlib - {"torch", "transformers"}
        assert not foreign, f"{path.name} imports {sorted(foreign)}"
        assert "import pelab" not in path.read_text() and "from pelab" not in path.read_text()


def test_the_rewrite_keeps_names_aliases_and_indentation():
    source = ("from pelab.model.attention.span import Span, visible_keys as keys\n"
              "def f():\n"
              "    from omegaconf import (OmegaConf,\n"
              "                           DictConfig)\n"
              "    from pelab.encodings.config import pe_settings\n"
              "    return OmegaConf\n")
    text, wanted = rewrite(source, {"pelab.model.attention.span"})
    assert text == ("from .pelab_model_attention_span import Span, visible_keys as keys\n"
                    "def f():\n"
                    "    from .pelab_shims import OmegaConf, DictConfig\n"
                    "    from .pelab_shims import pe_settings\n"
                    "    return OmegaConf\n")
    assert wanted == {"pelab_shims": {"OmegaConf", "DictConfig", "pe_settings"}}


@pytest.mark.slow
def test_a_trained_runs_export_is_logged_as_an_artifact_of_its_wandb_run(trained_run, tmp_path, capsys):
    """pelab-export --remote-code on a run that logged to W&B offline: the export gives the checkpoint's logits and
    greedy continuations, and the run's W&B id gains an offline run that logs the folder as artifact hf-<id> (type model), for
    `wandb sync` to upload into that run."""
    from pelab.export import main
    from pelab.tasks.evaluate import load_model
    from pelab.training.checkpoints import load_run_checkpoint

    run = tmp_path / "run"
    shutil.copytree(trained_run[0], run)  # the session's run is shared: the export adds a W&B run folder
    run_id = (run / "wandb_run_id.txt").read_text().strip()
    before = set(offline_runs(run))
    assert main([str(run), str(tmp_path / "hf"), "--remote-code"]) == 0
    assert "trust_remote_code=True" in capsys.readouterr().out
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    ckpt = load_run_checkpoint(run / "checkpoints" / "last.ckpt")
    pelab = load_model(OmegaConf.create(ckpt["hyper_parameters"]["cfg"]), ckpt, model.config.vocab_size)
    x = torch.randint(0, model.config.vocab_size, (1, 64))
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, pelab.eval()(x), atol=1e-5, rtol=1e-5)
        greedy = x[:, :8]  # transformers' generate (no cache) = PELab's own argmax, token by token
        for _ in range(4):
            greedy = torch.cat([greedy, pelab(greedy)[:, -1].argmax(-1, keepdim=True)], dim=1)
        assert torch.equal(model.generate(x[:, :8], max_new_tokens=4, do_sample=False), greedy)
    new = sorted(set(offline_runs(run)) - before)
    assert len(new) == 1 and new[0].name.endswith(run_id)
    logged = json.dumps(wandb_records(new[0]))
    assert f"hf-{run_id}" in logged and "model.safetensors" in logged
