"""Per-matrix kernel search and the best-known store.

    sparserl search A.mtx --budget 64          # best kernel, report, trace; store updated
    sparserl best list | show NAME | export pairs.jsonl

* :mod:`.space`: the kernel space of one matrix (every template's points) and the moves on it;
* :mod:`.loop`: the search loop (seeds, mutations, policy proposals; every candidate through the harness);
* :mod:`.policy`: the policy's proposals and the refinement prompt;
* :mod:`.store`: the best-known store (SQLite);  :mod:`.export`: the store as SFT pairs;
* :mod:`.run`: one search from a matrix file to an output folder (and ``generate --search``);
* :mod:`.footprint`: whether a matrix fits on the GPU.
"""

from sparserl.search.loop import SearchConfig, SearchResult, TraceEntry, run_search
from sparserl.search.space import CandidateSpace, Proposal, Provenance
from sparserl.search.store import BestStore, open_store

__all__ = ["BestStore", "CandidateSpace", "Proposal", "Provenance", "SearchConfig", "SearchResult", "TraceEntry",
           "open_store", "run_search"]
