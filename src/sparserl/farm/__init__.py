"""The farm: tune a collection of matrices across the GPUs and hosts of a Ray cluster.

    sparserl farm matrices/ --ray head:6379 --store postgresql://user@db/sparserl --out runs/farm

* :mod:`.ray_evaluator`: the evaluator interface on Ray (compiles as CPU tasks, one actor per GPU);
* :mod:`.health`: whether a GPU is shared or throttled (``nvidia-smi``);
* :mod:`.run`: the farm itself: one search per matrix, several at once, resumable, a journal of
  every verified result, the summary;
* :mod:`.display`, :mod:`.summary`: its progress display and its summary;  :mod:`.cli`: ``sparserl farm``;
* :mod:`.local_cluster`: a Ray cluster of several nodes on one machine (tests, benchmark).

Ray and psycopg are the ``farm`` extra (``pip install -e '.[farm]'``); nothing here imports Ray
unless a ``--ray`` address is given, and without one the farm runs on this host's evaluator.
"""
