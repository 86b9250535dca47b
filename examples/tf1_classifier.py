"""A small TF1 classifier, written the way TF1 tutorials wrote it."""
import argparse

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()


def build_model(images, num_classes):
    hidden = tf.layers.dense(images, 64, activation=tf.nn.relu)
    return tf.layers.dense(hidden, num_classes)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    images = tf.placeholder(tf.float32, [None, 32], name="images")
    labels = tf.placeholder(tf.int64, [None], name="labels")
    logits = build_model(images, 10)
    loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    )
    global_step = tf.train.get_or_create_global_step()
    optimizer = tf.train.MomentumOptimizer(args.lr, momentum=0.9)
    train_op = optimizer.minimize(loss, global_step=global_step)

    rng = np.random.RandomState(0)
    data = rng.randn(256, 32).astype(np.float32)
    targets = (data[:, :10].argmax(axis=1)).astype(np.int64)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for step in range(args.steps):
            _, value = sess.run([train_op, loss], {images: data, labels: targets})
            if step % 10 == 0:
                print("step", step, "loss", value)


if __name__ == "__main__":
    main()
