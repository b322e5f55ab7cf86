"""Writes expected.config: what EasyRec's own converter (0.7.1,
easy_rec.python.utils.convert_rtp_fg.load_input_field_and_feature_config,
which fg_json_path runs) makes of all_types.json, with label field `clk`.
Run with EasyRec 0.7.1 installed: python make_expected.py"""
import json
import os

from google.protobuf import text_format

from easy_rec.python.utils.convert_rtp_fg import load_input_field_and_feature_config

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, 'all_types.json')) as f:
  fg = json.load(f)
cfg = load_input_field_and_feature_config(fg, label_fields=['clk'])
with open(os.path.join(here, 'expected.config'), 'w') as f:
  f.write(text_format.MessageToString(cfg))
