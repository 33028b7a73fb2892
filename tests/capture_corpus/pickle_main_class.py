import pickle

class Point:
    def __init__(self, x):
        self.x = x

print(pickle.loads(pickle.dumps(Point(3))).x)
