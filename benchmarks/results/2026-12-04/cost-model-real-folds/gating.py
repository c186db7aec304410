"""One model on generated and real matrices against the generated ones alone (the README's table); writes gating.json here."""
import json
from pathlib import Path
from sparserl.search import cost_quality as cq
from sparserl.search.cost_model import TrainConfig, load_measurements, trainable
O="benchmarks/results/2026-12-02/cost-model"; N="benchmarks/results/2026-12-04/cost-model-more-data"
data=[m for f in (f"{O}/measurements_trainable_gpu.jsonl.gz", f"{O}/templates_speed_measurements.jsonl") for m in load_measurements(f)]
held=[m for f in (f"{O}/measurements_heldout_gpu.jsonl.gz", f"{N}/measurements_heldout_30k_300k_gpu.jsonl.gz") for m in load_measurements(f)]
tr,_=trainable(data); held += [m for m in data if m not in tr]
tr=[m for m in tr if m.family!="suitesparse"]
ss=load_measurements(f"{N}/measurements_suitesparse_gpu.jsonl.gz")
cfg=TrainConfig(min_matrices=2, real_part=False)  # one model on both kinds
top=max(m.card.nnz for m in ss)
gen=cq.score_split(tr, ss, cfg); cf=cq.cross_fit(tr, ss, 4, cfg)
def bucket(n): return "under 20k" if n<20000 else "20k-100k" if n<100000 else "100k and more"
out={"suitesparse_max_nnz":top,"buckets":{}}
for b in ("under 20k","20k-100k","100k and more"):
    idx=[i for i,m in enumerate(ss) if bucket(m.card.nnz)==b]
    out["buckets"][b]={"matrices":len(idx),"generated_only_recall":sum(gen[i].recall for i in idx),"cross_fit_recall":sum(cf[i].recall for i in idx),
       "generated_only_near":sum(gen[i].near for i in idx),"cross_fit_near":sum(cf[i].near for i in idx)}
a=cq.score_split(tr, held, cfg); b=cq.score_split(tr+ss, held, cfg)
gated=[y if m.card.nnz<=top else x for x,y,m in zip(a,b,held)]
out["held_out_families"]={"generated_only":cq.summary(a),"with_suitesparse":cq.summary(b),"gated_by_size":cq.summary(gated),
  "per_matrix":[{"matrix":m.name,"nnz":m.card.nnz,"generated_only":[bool(x.recall),round(x.regret,4)],"with_suitesparse":[bool(y.recall),round(y.regret,4)]} for x,y,m in zip(a,b,held)]}
out["suitesparse"]={"generated_only":cq.summary(gen),"cross_fit_4_folds":cq.summary(cf)}
print(json.dumps(out,indent=1))
(Path(__file__).parent / 'gating.json').write_text(json.dumps(out, indent=1))
