"""The sandbox image the docker backends run by default, named by its recipe.

`make images` runs backends/images/sandbox/build.sh, which tags what it builds
`execgate-sandbox:<first 12 hex digits of the sha256 of build.sh>`; this module
computes the same name, so a backend always asks for the image of the recipe it
ships with, and a changed recipe is a new image (never a stale one reused).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

RECIPE = Path(__file__).parents[1] / "images" / "sandbox" / "build.sh"
REPOSITORY = "execgate-sandbox"


def recipe_hash(recipe: Path = RECIPE) -> str:
    return hashlib.sha256(recipe.read_bytes()).hexdigest()[:12]


def default_image(recipe: Path = RECIPE) -> str:
    return f"{REPOSITORY}:{recipe_hash(recipe)}"
