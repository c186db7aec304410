"""One kernel request: a matrix and the operation asked of it, the kernels proposed for it, and the
answer handed back.

* :mod:`.context`: :class:`~.context.MatrixContext`, the matrix summarised once (features, card,
  encoder input, harness registration) and passed down;
* :mod:`.candidates`: candidates of every origin (samples, search, library) in one pool, and the
  choice among them;
* :mod:`.library`: the rule-based selector and the library's candidates;
* :mod:`.report`: :class:`~.report.KernelReport` and the folder it is written to.

``generate`` and ``search`` (and ``evaluate``, ``improve``, the farm and ``tune``) build on these.
"""
