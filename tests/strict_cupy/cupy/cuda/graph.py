"""``cupy.cuda.graph.Graph`` of the stand-in: the launches recorded during a capture,
replayed in order on the buffers they had (NOTE [graph replay] in cuvmap/cuda/graphs.py
relies on exactly that)."""
from cupy._strict import capture


class Graph:
    def __init__(self, nodes, stream, keep=()):
        self.nodes = list(nodes)
        self.keep = list(keep)  # the buffers the launches address (NOTE [the stand-in's addresses])
        self.stream = stream
        self.launches = 0

    def launch(self, stream=None):
        if capture() is not None:  # a graph launched inside another capture: a child graph
            cap = capture()
            cap.nodes.extend(self.nodes)
        for node in self.nodes:
            node.replay()
        self.launches += 1

    def upload(self, stream=None):
        pass

    def names(self):
        """The launches, by name, in order."""
        return [n.name for n in self.nodes]

    def __repr__(self):
        return f"<stand-in CUDA graph of {len(self.nodes)} launches>"

