"""The MXNet Gluon target: `mxnet.contrib.amp` for Gluon training loops."""
