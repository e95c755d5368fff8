"""What a package index shows: classifiers from the trove list, keywords, authors, a long description it can render.

The built sdist and wheel themselves (``twine check --strict``, ``examples/`` and ``configs/`` in the sdist) are
checked by the slow ``test_wheel.py``.
"""

import re
from pathlib import Path

import tomllib
from trove_classifiers import classifiers as TROVE

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_every_classifier_is_in_the_trove_list_and_says_python_and_topic():
    given = PROJECT["classifiers"]
    assert given and not [classifier for classifier in given if classifier not in TROVE]
    assert len(set(given)) == len(given)
    assert any(c.startswith("Topic :: ") for c in given) and "Programming Language :: Python :: 3 :: Only" in given
    lowest = PROJECT["requires-python"].removeprefix(">=")
    assert f"Programming Language :: Python :: {lowest}" in given
    # PEP 639: the SPDX `license` expression says the license; setuptools refuses a License :: classifier beside it
    assert PROJECT["license"] == "Apache-2.0" and not any(c.startswith("License :: ") for c in given)


def test_keywords_and_authors():
    assert len(PROJECT["keywords"]) >= 5 and all(keyword.strip() == keyword for keyword in PROJECT["keywords"])
    assert PROJECT["authors"] and all(author.get("name") for author in PROJECT["authors"])


def test_the_long_description_has_no_link_an_index_cannot_resolve():
    readme = PROJECT["readme"]
    text = (ROOT / readme["file"]).read_text()
    assert readme["content-type"] == "text/markdown"
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"<img[^>]*src=\"([^\"]+)\"", text)
    assert all("://" in target for target in targets), [target for target in targets if "://" not in target]
    # README's opening paragraph, word for word: the index says what the front door says
    opening = lambda page: page.split("\n\n")[1]  # noqa: E731
    assert opening(text) == opening((ROOT / "README.md").read_text())
    assert 'pip install "layerwise[vision]"' in text and "layerwise fit --config quickstart" in text


def test_the_sdist_takes_the_examples_configs_and_docs():
    manifest = (ROOT / "MANIFEST.in").read_text().splitlines()
    assert {"graft configs", "graft examples", "graft docs"} <= set(manifest)
    assert (ROOT / "examples" / "feature_norm.py").is_file()
