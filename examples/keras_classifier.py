"""A small Keras classifier trained with compile/fit on random data."""
import numpy as np
import keras

x = np.random.rand(512, 20).astype("float32")
y = np.random.randint(0, 3, size=(512,))

model = keras.Sequential([
    keras.Input(shape=(20,)),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(3, activation="softmax"),
])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, batch_size=32, epochs=2)
