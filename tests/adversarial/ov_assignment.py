"""Which nodes OpenVINO takes, as onnxruntime's own plan says; run by the ort-openvino env's python.

``python ov_assignment.py GRAPHS.json``: GRAPHS is a list of paths; prints ``{path: {ep: [node
names]}}``. The corpus checks its construction metadata against this (which ops the EP takes),
with onnxruntime's API alone: no xstage code is involved.
"""

import json
import sys

import onnxruntime as ort


def main(listing):
    ort.set_default_logger_severity(3)
    out = {}
    for path in json.load(open(listing)):
        options = ort.SessionOptions()
        options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        session = ort.InferenceSession(
            path, options, providers=[("OpenVINOExecutionProvider", {"device_type": "CPU"}),
                                      "CPUExecutionProvider"])
        plan = {}
        for group in session.get_provider_graph_assignment_info():
            plan.setdefault(group.ep_name, []).extend(n.name for n in group.get_nodes())
        out[path] = plan
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
