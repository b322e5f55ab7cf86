"""EasyRec's own predictor (easy_rec.python.inference.predictor.Predictor) on
an EasyRec export, over the rows of a CSV file of the config's input layout:
writes every `probs*` output per row. Run by EasyRec's Python environment
(`bench/parity.py` calls it for its checkpoint cross-check).

usage: parity_predict.py PIPELINE_CONFIG EXPORT_DIR ROWS_CSV OUT_CSV
"""

import csv
import os
import sys

import numpy as np
from easy_rec.python.inference.predictor import Predictor
from easy_rec.python.protos.dataset_pb2 import DatasetConfig
from easy_rec.python.utils import config_util


def typed(value, field_type, default):
    """A CSV cell as EasyRec's CSV input types it (empty cells take the
    field's default)."""
    ft = DatasetConfig.FieldType
    if value == "":
        value = default
    if field_type in (ft.INT32, ft.INT64):
        return int(value) if value != "" else 0
    if field_type in (ft.FLOAT, ft.DOUBLE):
        return float(value) if value != "" else 0.0
    return value


def main():
    cfg_path, export_base, rows_path, out_path = sys.argv[1:5]
    dc = config_util.get_configs_from_pipeline_file(cfg_path).data_config
    fields = list(dc.input_fields)
    with open(rows_path, newline="") as f:
        rows = list(csv.reader(f, delimiter=dc.separator or ","))
    if dc.with_header:
        rows = rows[1:]
    rows = [r for r in rows if len(r) == len(fields)]
    cols = {
        fld.input_name: [typed(r[j], fld.input_type, fld.default_val) for r in rows]
        for j, fld in enumerate(fields)
    }
    exports = sorted(
        d for d in os.listdir(export_base) if os.path.exists(os.path.join(export_base, d, "saved_model.pb"))
    )
    predictor = Predictor(os.path.join(export_base, exports[-1]))
    data = [{k: cols[k][i] for k in predictor.input_names} for i in range(len(rows))]
    outs = predictor.predict(data, batch_size=-1)
    keys = sorted(k for k in outs[0] if k.startswith("probs"))
    with open(out_path, "w") as f:
        f.write(",".join(keys) + "\n")
        for o in outs:
            f.write(",".join(repr(float(np.asarray(o[k]).reshape(-1)[0])) for k in keys) + "\n")


if __name__ == "__main__":
    main()
