// Reads TensorBoard event files with an independent reader: the npm `tfrecord` package's RecordReader
// (TFRecord framing, both masked CRC-32Cs checked) and protobufjs decoding TensorFlow's Event message,
// declared below with TensorFlow's own field numbers (tensorflow/core/util/event.proto,
// framework/summary.proto, tensor.proto, tensor_shape.proto). Installed by scripts/tfrecord-node.sh;
// run by pkg/tbevent TestIndependentReader. Environment: TFRECORD_NODE (the folder tfrecord is
// installed in). Arguments: event files. Prints one JSON document: per file, its events.
'use strict';
const path = require('path');
const base = path.resolve(process.env.TFRECORD_NODE, 'node_modules');
const { RecordReader } = require(path.join(base, 'tfrecord'));
const protobuf = require(path.join(base, 'protobufjs'));

const schema = `
syntax = "proto3";
package tensorflow;
message Event {
  double wall_time = 1;
  int64 step = 2;
  oneof what {
    string file_version = 3;
    bytes graph_def = 4;
    Summary summary = 5;
  }
  SourceMetadata source_metadata = 10;
}
message SourceMetadata { string writer = 1; }
message Summary {
  message Value {
    string node_name = 7;
    string tag = 1;
    SummaryMetadata metadata = 9;
    oneof value {
      float simple_value = 2;
      bytes obsolete_old_style_histogram = 3;
      HistogramProto histo = 5;
      TensorProto tensor = 8;
    }
  }
  repeated Value value = 1;
}
message SummaryMetadata {
  message PluginData { string plugin_name = 1; bytes content = 2; }
  PluginData plugin_data = 1;
  string display_name = 2;
  string summary_description = 3;
}
message HistogramProto {
  double min = 1;
  double max = 2;
  double num = 3;
  double sum = 4;
  double sum_squares = 5;
  repeated double bucket_limit = 6 [packed = true];
  repeated double bucket = 7 [packed = true];
}
message TensorShapeProto {
  message Dim { int64 size = 1; string name = 2; }
  repeated Dim dim = 2;
  bool unknown_rank = 3;
}
message TensorProto {
  int32 dtype = 1;
  TensorShapeProto tensor_shape = 2;
  int32 version_number = 3;
  bytes tensor_content = 4;
  repeated bytes string_val = 8;
}
`;
const Event = protobuf.parse(schema).root.lookupType('tensorflow.Event');

async function readFile(file) {
  const reader = await RecordReader.create(file);
  const events = [];
  for (;;) {
    const rec = await reader.readRecord();
    if (rec === null) break;
    const e = Event.toObject(Event.decode(Buffer.from(rec)), { longs: Number, bytes: String, defaults: false });
    const out = { wall_time: e.wallTime, step: e.step || 0 };
    if (e.fileVersion) out.file_version = e.fileVersion;
    if (e.sourceMetadata) out.writer = e.sourceMetadata.writer;
    if (e.summary) {
      out.values = (e.summary.value || []).map((v) => {
        const o = { tag: v.tag };
        if (v.simpleValue !== undefined) o.simple_value = Number.isNaN(v.simpleValue) ? 'NaN' : v.simpleValue;
        if (v.metadata && v.metadata.pluginData) o.plugin = v.metadata.pluginData.pluginName;
        if (v.tensor) {
          o.dtype = v.tensor.dtype;
          o.shape = ((v.tensor.tensorShape || {}).dim || []).map((d) => d.size);
          o.text = (v.tensor.stringVal || []).map((s) => Buffer.from(s, 'base64').toString('utf8'));
        }
        if (v.histo) o.histo = v.histo;
        return o;
      });
    }
    events.push(out);
  }
  await reader.close();
  return events;
}

(async () => {
  const out = {};
  for (const f of process.argv.slice(2)) out[f] = await readFile(f);
  console.log(JSON.stringify(out));
})().catch((err) => {
  console.error(String(err && err.stack || err));
  process.exit(1);
});
