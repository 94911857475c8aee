"""parmem.book.widgets.tensor: the tensor-parallel explorers build headless.

(Its own file: ``test_book_widgets.py`` has a test of the same name for the other explorers.)
"""

import pytest


def test_explorers_build_headless():
    pytest.importorskip("ipywidgets")
    from parmem.book.widgets import (
        explore_layer_activations,
        explore_tp_shards,
        explore_tp_tradeoff,
        explore_tp_weights,
    )

    for make in (explore_tp_shards, explore_tp_weights, explore_tp_tradeoff,
                 explore_layer_activations):
        assert make(static=False).children  # controls and the output area
