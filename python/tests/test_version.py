"""One version number: kiln.__version__ is include/kiln/version.h's KILN_VERSION."""

import pathlib

import kiln

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_version_is_the_header_s():
    text = (REPO / "include/kiln/version.h").read_text()
    version = text.split('#define KILN_VERSION "', 1)[1].split('"', 1)[0]
    assert kiln.__version__ == version
    major, minor, patch = (int(part) for part in version.split("."))  # semantic versioning
    assert (major, minor, patch) >= (0, 2, 0)
