"""The flax NNX MNIST tutorial's CNN, tiny: `nnx.Optimizer(adamw)` and an `@nnx.jit` step.

Run as `python -m donate.profile tests/data/mnist_nnx.py` (tests/test_profile_report.py).
"""

import sys

import jax.numpy as jnp
import optax
from flax import nnx


class CNN(nnx.Module):
  def __init__(self, *, rngs: nnx.Rngs):
    self.conv1 = nnx.Conv(1, 8, kernel_size=(3, 3), rngs=rngs)
    self.conv2 = nnx.Conv(8, 16, kernel_size=(3, 3), rngs=rngs)
    self.avg_pool = lambda x: nnx.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
    self.linear1 = nnx.Linear(16 * 7 * 7, 64, rngs=rngs)
    self.linear2 = nnx.Linear(64, 10, rngs=rngs)

  def __call__(self, x):
    x = self.avg_pool(nnx.relu(self.conv1(x)))
    x = self.avg_pool(nnx.relu(self.conv2(x)))
    x = x.reshape(x.shape[0], -1)
    x = nnx.relu(self.linear1(x))
    return self.linear2(x)


def loss_fn(model, images, labels):
  logits = model(images)
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@nnx.jit
def train_step(model, optimizer, images, labels):
  loss, grads = nnx.value_and_grad(loss_fn)(model, images, labels)
  optimizer.update(model, grads)
  return loss


def main():
  model = CNN(rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
  images, labels = jnp.ones((32, 28, 28, 1)), jnp.zeros((32,), jnp.int32)
  for _ in range(2):
    loss = train_step(model, optimizer, images, labels)
  print(f"loss {float(loss):.4f}")
  if "--fail" in sys.argv:
    raise SystemExit(3)


if __name__ == "__main__":
  main()
