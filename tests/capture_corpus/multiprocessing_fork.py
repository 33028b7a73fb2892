import multiprocessing as mp

def square(x):
    return x * x

if __name__ == "__main__":
    with mp.get_context("fork").Pool(2) as pool:
        print(pool.map(square, range(5)))
