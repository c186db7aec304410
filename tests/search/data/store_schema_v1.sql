-- The best-known store's tables at schema version 1, as SparseRL wrote them before the
-- features column: what the migration test opens with the current code.
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS matrices (
    fingerprint TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    rows INTEGER NOT NULL,
    cols INTEGER NOT NULL,
    nnz INTEGER NOT NULL,
    card_json TEXT NOT NULL,
    coords_json TEXT,
    source_path TEXT,
    added_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS kernels (
    kernel_sha TEXT PRIMARY KEY,
    text TEXT NOT NULL,
    format TEXT,
    template TEXT,
    candidate_id TEXT
);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    op TEXT NOT NULL,
    k INTEGER NOT NULL,
    started_at TEXT NOT NULL,
    finished_at TEXT,
    status TEXT NOT NULL,
    config_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY,
    fingerprint TEXT NOT NULL REFERENCES matrices(fingerprint),
    op TEXT NOT NULL,
    k INTEGER NOT NULL,
    arch TEXT NOT NULL,
    gpu TEXT,
    regime TEXT NOT NULL,
    harness_version TEXT NOT NULL,
    kernel_sha TEXT NOT NULL REFERENCES kernels(kernel_sha),
    time_us REAL NOT NULL,
    cusparse_us REAL NOT NULL,
    speedup REAL NOT NULL,
    roofline REAL,
    provenance TEXT NOT NULL,
    parent_id TEXT,
    model TEXT,
    run_id TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS results_by_key ON results (fingerprint, op, k, arch);
CREATE TABLE IF NOT EXISTS best (
    fingerprint TEXT NOT NULL REFERENCES matrices(fingerprint),
    op TEXT NOT NULL,
    k INTEGER NOT NULL,
    arch TEXT NOT NULL,
    regime TEXT NOT NULL,
    harness_version TEXT NOT NULL,
    result_id INTEGER NOT NULL REFERENCES results(id),
    kernel_sha TEXT NOT NULL REFERENCES kernels(kernel_sha),
    time_us REAL NOT NULL,
    cusparse_us REAL NOT NULL,
    speedup REAL NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (fingerprint, op, k, arch, regime, harness_version)
);
