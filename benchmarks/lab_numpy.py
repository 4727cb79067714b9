"""The lab's NumPy algorithm, as the course's notebook writes it: the speed baseline.

``Network.backprop`` works on (batch, n, 1) arrays with batched ``@`` and keeps
every layer's input and output; ``NetworkWithCheckpointing`` recomputes whole
segments from checkpoints.  Only the data-loading and plotting cells are left out.
"""
import os
import time

import numpy as np
import psutil


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


class Network(object):
    def __init__(self, sizes):
        self.num_layers = len(sizes)
        self.sizes = sizes
        self.biases = [np.random.randn(y, 1) for y in sizes[1:]]
        self.weights = [np.random.randn(y, x) for x, y in zip(sizes[:-1], sizes[1:])]

    def feedforward(self, a):
        for b, w in zip(self.biases, self.weights):
            a = sigmoid(np.dot(w, a) + b)
        return a

    def update_mini_batch(self, x_mini_batch, y_mini_batch, eta):
        nabla_b, nabla_w = self.backprop(np.expand_dims(x_mini_batch, axis=-1),
                                         np.expand_dims(y_mini_batch, axis=-1))
        self.weights = [w - (eta) * nw for w, nw in zip(self.weights, nabla_w)]
        self.biases = [b - (eta) * nb for b, nb in zip(self.biases, nabla_b)]

    def backprop(self, x_batch, y_batch):
        delta_nabla_b = [None for _ in range(len(self.biases))]
        delta_nabla_w = [None for _ in range(len(self.weights))]
        before = []
        after = []
        for l in range(self.num_layers - 1):
            before.append(x_batch)
            x_batch = sigmoid(self.weights[l] @ x_batch + self.biases[l])
            after.append(x_batch)
        d_loss_act = after[self.num_layers - 2] - y_batch
        for l in range(self.num_layers - 2, -1, -1):
            delta_nabla_b[l] = d_loss_act * after[l] * (1 - after[l])
            delta_nabla_w[l] = delta_nabla_b[l] @ np.transpose(before[l], (0, 2, 1))
            d_loss_act = self.weights[l].T @ delta_nabla_b[l]
        return [b.mean(axis=0) for b in delta_nabla_b], [w.mean(axis=0) for w in delta_nabla_w]

    def evaluate(self, x_test_data, y_test_data):
        test_results = [(np.argmax(self.feedforward(x_test_data[i].reshape(784, 1))), np.argmax(y_test_data[i]))
                        for i in range(len(x_test_data))]
        return np.mean([int(x == y) for (x, y) in test_results])

    def cost_derivative(self, output_activations, y):
        return (output_activations - y)

    def SGD(self, training_data, epochs, mini_batch_size, eta, test_data=None):
        process = psutil.Process(os.getpid())
        memusage = []
        updatetime = []
        x_train, y_train = training_data
        if test_data:
            x_test, y_test = test_data
        for j in range(epochs):
            for i in range(x_train.shape[0] // mini_batch_size):
                t0 = time.time()
                memusage.append(process.memory_info().rss)
                x_mini_batch = x_train[i * mini_batch_size:(i * mini_batch_size + mini_batch_size)]
                y_mini_batch = y_train[i * mini_batch_size:(i * mini_batch_size + mini_batch_size)]
                self.update_mini_batch(x_mini_batch, y_mini_batch, eta)
                updatetime.append(time.time() - t0)
            if test_data:
                print("Epoch: {0}, Accuracy: {1}".format(j, self.evaluate(x_test, y_test)))
            else:
                print("Epoch: {0}".format(j))
        return memusage, updatetime


class NetworkWithCheckpointing(Network):
    def __init__(self, sizes, checkpoint_every_nth_layer: int = 0, *args, **kwargs):
        super().__init__(sizes, *args, **kwargs)
        self.checkpoint_every_nth_layer = checkpoint_every_nth_layer
        self.checkpoints_layer_idx = []
        check_idx_layer = 0
        while check_idx_layer < self.num_layers - 1:
            self.checkpoints_layer_idx.append(check_idx_layer)
            check_idx_layer += checkpoint_every_nth_layer

    def forward_between_checkpoints(self, a, layer_idx_start, layer_idx_end):
        after = [a]
        for i in range(layer_idx_start, layer_idx_end):
            a = sigmoid(self.weights[i] @ a + self.biases[i])
            after.append(a)
        return after

    def backprop(self, x, y):
        delta_nabla_b = [None for _ in range(len(self.biases))]
        delta_nabla_w = [None for _ in range(len(self.weights))]
        a = x
        next_checkpoint_idx = 0
        checkpoints = []
        for l in range(self.num_layers - 1):
            if self.checkpoints_layer_idx[next_checkpoint_idx] == l:
                checkpoints.append(a)
                if next_checkpoint_idx < len(self.checkpoints_layer_idx) - 1:
                    next_checkpoint_idx += 1
                    if next_checkpoint_idx == len(self.checkpoints_layer_idx):
                        break
            a = sigmoid(self.weights[l] @ a + self.biases[l])
        d_loss_act = None
        stop_layer_idx = self.num_layers - 1
        for j in reversed(range(len(self.checkpoints_layer_idx))):
            checkpoint_activation = checkpoints[j]
            checkpoint_layer_idx = self.checkpoints_layer_idx[j]
            activations = self.forward_between_checkpoints(checkpoint_activation, checkpoint_layer_idx,
                                                           stop_layer_idx)
            stop_layer_idx = checkpoint_layer_idx
            for i in reversed(range(len(activations) - 1)):
                before, after = activations[i], activations[i + 1]
                l_idx = checkpoint_layer_idx + i
                if d_loss_act is None:
                    d_loss_act = after - y
                delta_nabla_b[l_idx] = d_loss_act * after * (1 - after)
                delta_nabla_w[l_idx] = delta_nabla_b[l_idx] @ np.transpose(before, (0, 2, 1))
                d_loss_act = self.weights[l_idx].T @ delta_nabla_b[l_idx]
        return [b.mean(axis=0) for b in delta_nabla_b], [w.mean(axis=0) for w in delta_nabla_w]
