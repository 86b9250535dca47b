"""A small MXNet Gluon classifier with gradient clipping, trained on random data."""
import mxnet as mx
from mxnet import autograd, gluon, nd

net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(64, activation="relu"), gluon.nn.Dense(3))
net.initialize(mx.init.Xavier())
net.hybridize()
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
x = nd.random.normal(shape=(256, 20))
y = nd.random.randint(0, 3, shape=(256,)).astype("float32")
for epoch in range(5):
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    grads = [p.grad() for p in net.collect_params().values()]
    gluon.utils.clip_global_norm(grads, 1.0)
    trainer.step(x.shape[0])
    print("epoch", epoch, "loss", loss.mean().asscalar())
